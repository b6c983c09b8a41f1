//! HTTPS for the remote handle: which certificate authorities it trusts,
//! and errors that say when a head's certificate is the trouble.

#[cfg(feature = "rustls")]
use std::path::Path;

use crate::error::StateError;

/// Certificate authorities a remote handle trusts for an `https://` head,
/// *instead of* the system's roots (as `curl --cacert` does): a head whose
/// certificate a private CA signed can be vouched for by that CA alone.
///
/// Without one, an `https://` handle trusts the system's roots.
#[cfg(feature = "rustls")]
#[derive(Clone)]
pub struct TrustedCas {
    certs: Vec<reqwest::Certificate>,
}

#[cfg(feature = "rustls")]
impl std::fmt::Debug for TrustedCas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedCas").field("certificates", &self.certs.len()).finish()
    }
}

#[cfg(feature = "rustls")]
impl TrustedCas {
    /// Every certificate (`-----BEGIN CERTIFICATE-----`) of a PEM bundle.
    /// A bundle without one is refused; so is a block that is not one.
    pub fn from_pem(pem: &[u8]) -> Result<Self, StateError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;

        let invalid = |message: String| StateError::invalid("ca_cert", message);
        let ders = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not a PEM certificate bundle: {e}")))?;
        if ders.is_empty() {
            return Err(invalid("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
        }
        let certs = ders
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not a certificate: {}", chain(&e))))?;
        Ok(Self { certs })
    }

    /// [`TrustedCas::from_pem`] of the file at `path`.
    pub fn from_pem_file(path: &Path) -> Result<Self, StateError> {
        let pem = std::fs::read(path).map_err(|e| {
            StateError::invalid("ca_cert", format!("cannot read {}: {e}", path.display()))
        })?;
        Self::from_pem(&pem)
    }
}

/// The HTTP client for a head at `base` (`http://` or `https://`).
#[cfg(feature = "rustls")]
pub(super) fn client(base: &str, cas: Option<&TrustedCas>) -> Result<reqwest::Client, StateError> {
    let https = base.starts_with("https://");
    let mut builder = reqwest::Client::builder();
    match cas {
        Some(_) if !https => {
            return Err(StateError::invalid(
                "ca_cert",
                format!(
                    "a CA certificate is given for {base}, which is not https://; use an https:// URL or give no CA"
                ),
            ));
        }
        Some(cas) => builder = builder.tls_certs_only(cas.certs.iter().cloned()),
        None => {}
    }
    builder.build().map_err(|e| match cas {
        Some(_) => StateError::invalid("ca_cert", format!("cannot be trusted: {}", chain(&e))),
        None => StateError::unavailable(format!("cannot build an HTTP client: {}", chain(&e))),
    })
}

/// The HTTP client for a head at `base`: plain HTTP only, as this build
/// has no TLS (trainstate-client's `rustls` feature).
#[cfg(not(feature = "rustls"))]
pub(super) fn client(base: &str) -> Result<reqwest::Client, StateError> {
    if base.starts_with("https://") {
        return Err(StateError::invalid(
            "url",
            "https:// needs TLS, which this build lacks (trainstate-client's `rustls` feature)",
        ));
    }
    reqwest::Client::builder()
        .build()
        .map_err(|e| StateError::unavailable(format!("cannot build an HTTP client: {}", chain(&e))))
}

/// Why a request to `base` failed, with its causes; for an `https://`
/// head whose certificate is not trusted, what to do about it. The flag
/// says whether retrying within the same call is useless: a certificate
/// refused now is refused again a moment later (the caller may still try
/// again later, as after a rotation).
pub(super) fn transport_error(base: &str, err: &reqwest::Error) -> (String, bool) {
    let text = chain(err);
    #[cfg(feature = "rustls")]
    if untrusted_certificate(err) {
        let message = format!(
            "{base}: the head's TLS certificate is not trusted ({text}); trust the CA that \
             signed it (--ca-cert PEM, TRAINSTATE_CA_CERT)"
        );
        return (message, true);
    }
    (format!("{base}: {text}"), false)
}

/// `err` and each of its causes, `: `-separated, without repeats.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// True when `err` was caused by a certificate rustls refused.
#[cfg(feature = "rustls")]
fn untrusted_certificate(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(cause) = next {
        if let Some(rustls::Error::InvalidCertificate(_)) = cause.downcast_ref::<rustls::Error>() {
            return true;
        }
        // An `io::Error`'s `source` skips the error it wraps: go inside.
        next = match cause.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => cause.source(),
        };
    }
    false
}
