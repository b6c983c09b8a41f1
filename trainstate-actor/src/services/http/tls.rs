//! TLS on the head's connections: its certificate and key, read from PEM
//! files and reloaded on request, and each accepted socket's IO, plain or
//! TLS.
//!
//! The handshake happens where the connection is served (its own task),
//! never in the accept loop: [`Transport::io`] returns at once, and the IO
//! it returns completes the handshake the first time it is read or
//! written, within a deadline. So a client that is slow to handshake holds
//! only its own connection.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{ServerConfig, crypto::aws_lc_rs};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{Accept, TlsAcceptor};

/// Why a certificate or key could not be used; nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// The certificate file is unreadable or holds no usable certificate.
    #[error("{}: {reason}", path.display())]
    Certificate {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key file is unreadable or holds no usable private key.
    #[error("{}: {reason}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error("the key in {} is not the key of the certificate in {}: {reason}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls found.
        reason: String,
    },
}

/// The head's TLS identity: a certificate chain and its private key, read
/// from PEM files. [`ServerTls::reload`] reads the files again; new
/// handshakes use what it read, and open connections go on as they are.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Arc<CurrentKey>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

impl ServerTls {
    /// Reads the certificate chain (`cert`: PEM, the server's certificate
    /// first, then any intermediates) and its private key (`key`: PEM,
    /// PKCS#8, PKCS#1 or SEC1), and checks that the key is the
    /// certificate's.
    pub fn from_pem_files(
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Result<Self, TlsFileError> {
        let (cert, key) = (cert.into(), key.into());
        let provider = Arc::new(aws_lc_rs::default_provider());
        let certified = load(&cert, &key, &provider)?;
        let current = Arc::new(CurrentKey(RwLock::new(Arc::new(certified))));
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFileError::Certificate { path: cert.clone(), reason: e.to_string() })?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // The head speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        Ok(Self { cert, key, provider, current, acceptor })
    }

    /// Reads both files again. On success, every handshake from now on
    /// uses the new certificate; on failure the current one stays, and the
    /// error says why.
    pub fn reload(&self) -> Result<(), TlsFileError> {
        let certified = load(&self.cert, &self.key, &self.provider)?;
        *self.current.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(certified);
        Ok(())
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The key file.
    pub fn key_path(&self) -> &Path {
        &self.key
    }
}

/// Reads and pairs a certificate chain and its key.
fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsFileError> {
    const NO_CERTIFICATE: &str = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)";
    const NO_KEY: &str = "holds no PEM private key (-----BEGIN PRIVATE KEY-----, \
                          or an RSA or EC private key)";
    let cert_error = |err: pem::Error| TlsFileError::Certificate {
        path: cert.to_owned(),
        reason: pem_reason(err, NO_CERTIFICATE),
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(cert_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(cert_error)?;
    if chain.is_empty() {
        return Err(cert_error(pem::Error::NoItemsFound));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|err| TlsFileError::Key {
        path: key.to_owned(),
        reason: pem_reason(err, NO_KEY),
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| TlsFileError::Mismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// What is wrong with a PEM file, `missing` saying what it lacks.
fn pem_reason(err: pem::Error, missing: &str) -> String {
    match err {
        pem::Error::NoItemsFound => missing.to_owned(),
        pem::Error::Io(err) => format!("cannot read it: {err}"),
        other => format!("not a valid PEM file: {other}"),
    }
}

/// The certificate handshakes use now; swapped by [`ServerTls::reload`].
#[derive(Debug)]
struct CurrentKey(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

/// How accepted sockets become connections: plain HTTP, or TLS with a
/// handshake deadline.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    tls: Option<Arc<ServerTls>>,
    handshake_timeout: Duration,
}

impl Transport {
    /// Plain HTTP without `tls`; otherwise TLS, each handshake given
    /// `handshake_timeout` from the moment the socket is accepted.
    pub(crate) fn new(tls: Option<Arc<ServerTls>>, handshake_timeout: Duration) -> Self {
        Self { tls, handshake_timeout }
    }

    /// The connection's IO over `stream`. Returns at once: a TLS handshake
    /// is driven by the first read or write of the IO, on the task that
    /// serves the connection, and fails the connection past its deadline.
    pub(crate) fn io(&self, stream: TcpStream) -> ConnectionIo {
        match &self.tls {
            None => ConnectionIo::Plain(stream),
            Some(tls) => ConnectionIo::Handshake(Box::new(Handshake {
                peer: stream.peer_addr().ok(),
                accept: tls.acceptor.accept(stream),
                deadline: Box::pin(tokio::time::sleep(self.handshake_timeout)),
                timeout: self.handshake_timeout,
            })),
        }
    }
}

/// One connection's bytes: a plain socket, or TLS over it (its handshake
/// first).
pub(crate) enum ConnectionIo {
    /// Plain HTTP.
    Plain(TcpStream),
    /// A TLS handshake under way.
    Handshake(Box<Handshake>),
    /// TLS, after the handshake.
    Tls(Box<TlsStream<TcpStream>>),
    /// A handshake that failed; the socket is closed.
    Failed,
}

/// A TLS handshake under way, and its deadline.
pub(crate) struct Handshake {
    peer: Option<std::net::SocketAddr>,
    accept: Accept<TcpStream>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl ConnectionIo {
    /// Drives the handshake, if one is under way, to its end.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Self::Handshake(handshake) = self else {
            return Poll::Ready(Ok(()));
        };
        let outcome = match Pin::new(&mut handshake.accept).poll(cx) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => {
                ready!(handshake.deadline.as_mut().poll(cx));
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TLS handshake within {:?}", handshake.timeout),
                ))
            }
        };
        let peer = handshake.peer;
        match outcome {
            Ok(stream) => {
                *self = Self::Tls(Box::new(stream));
                Poll::Ready(Ok(()))
            }
            Err(err) => {
                // A client speaking plain HTTP to this port, one that does
                // not trust the certificate, or a scanner: its business.
                tracing::debug!(peer = ?peer, "TLS handshake failed: {err}");
                *self = Self::Failed;
                Poll::Ready(Err(err))
            }
        }
    }
}

fn failed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the TLS handshake failed")
}

impl AsyncRead for ConnectionIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
            Self::Handshake(_) | Self::Failed => Poll::Ready(Err(failed())),
        }
    }
}

impl AsyncWrite for ConnectionIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
            Self::Handshake(_) | Self::Failed => Poll::Ready(Err(failed())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
            Self::Handshake(_) | Self::Failed => Poll::Ready(Err(failed())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // Both a socket and a TLS stream take vectored writes.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            // Nothing of the connection's own was written yet.
            Self::Handshake(_) | Self::Failed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            // Closing before the handshake ended: dropping the socket closes it.
            Self::Handshake(_) | Self::Failed => Poll::Ready(Ok(())),
        }
    }
}
