//! What a worker knows about its own process: [`WorkerMetadata`], probed
//! from explicit [`ProbeInputs`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;

use trainstate_schema::limits::MAX_GPUS_PER_WORKER;
use trainstate_schema::{Resources, validate_name};

/// The variable CUDA reads the visible GPUs from.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// The variable the NVIDIA container runtime reads the visible GPUs from.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The variable a shell sets to the host's name; read when no hostname file is.
pub const HOSTNAME: &str = "HOSTNAME";

/// The metadata a worker reports about its own process.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkerMetadata {
    /// The worker's process id.
    pub pid: u32,
    /// The id of the worker's node: stable per machine.
    pub node_id: String,
    /// The address of the node's interface that routes to the head.
    pub node_ip: IpAddr,
    /// The ids of the GPUs the worker sees.
    pub gpu_ids: Vec<u32>,
    /// The resources the worker has.
    pub resources: Resources,
    /// The host name of the worker's node, shown beside its id; `None`
    /// when unknown.
    pub node_name: Option<String>,
}

impl WorkerMetadata {
    /// Metadata from known values (for worker groups that learn them
    /// elsewhere).
    pub fn new(
        pid: u32,
        node_id: impl Into<String>,
        node_ip: IpAddr,
        gpu_ids: Vec<u32>,
        resources: Resources,
    ) -> Self {
        Self { pid, node_id: node_id.into(), node_ip, gpu_ids, resources, node_name: None }
    }

    /// The same metadata with the node's host name.
    pub fn with_node_name(mut self, node_name: impl Into<String>) -> Self {
        self.node_name = Some(node_name.into());
        self
    }

    /// Probes the current process, reading only `inputs`; each warning is
    /// also logged.
    pub fn probe(inputs: &ProbeInputs) -> Self {
        let (metadata, warnings) = Self::probe_with_warnings(inputs);
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        metadata
    }

    /// Probes the current process, reading only `inputs`, and returns what
    /// was found with the warnings about it (nothing is logged).
    ///
    /// - `pid`: the current process's id.
    /// - `node_id`: the trimmed content of the machine-id file when it is a
    ///   valid node id ([`trainstate_schema::validate_name`]), else `host-`
    ///   and the FNV-1a 64 hash (16 hex digits) of the hostname.
    /// - `node_name`: the hostname (see [`ProbeInputs::resolve_hostname`])
    ///   when it is a valid name.
    /// - `node_ip`: `inputs.node_ip` when set; else the address of the
    ///   interface that routes to `inputs.head` (a UDP socket is connected,
    ///   no packet is sent); else `127.0.0.1`.
    /// - `gpu_ids`: from `CUDA_VISIBLE_DEVICES`, else `NVIDIA_VISIBLE_DEVICES`
    ///   (see [`parse_visible_devices`]).
    /// - `resources`: `inputs.resources` when set; else `CPU` (the
    ///   parallelism available to the process) and, when GPUs are visible,
    ///   `GPU` (their number).
    pub fn probe_with_warnings(inputs: &ProbeInputs) -> (Self, Vec<ProbeWarning>) {
        let mut warnings = Vec::new();
        let node_id = node_id(inputs);
        let node_ip = match (inputs.node_ip, inputs.head) {
            (Some(ip), _) => ip,
            (None, Some(head)) => route_to(head).unwrap_or_else(|reason| {
                warnings.push(ProbeWarning::NodeIpFallback { head, reason });
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            }),
            (None, None) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let (variable, value) = match inputs.env.get(CUDA_VISIBLE_DEVICES) {
            Some(value) => (Some(CUDA_VISIBLE_DEVICES), Some(value.as_str())),
            None => match inputs.env.get(NVIDIA_VISIBLE_DEVICES) {
                Some(value) => (Some(NVIDIA_VISIBLE_DEVICES), Some(value.as_str())),
                None => (None, None),
            },
        };
        let gpu_ids = match value.and_then(parse_visible_devices) {
            Some(ids) => ids,
            None => {
                warnings.push(ProbeWarning::NoGpuIds { variable, value: value.map(str::to_owned) });
                Vec::new()
            }
        };
        let resources = inputs.resources.clone().unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            let mut resources = Resources::from_iter([("CPU", cpus as f64)]);
            if !gpu_ids.is_empty() {
                resources.insert("GPU", gpu_ids.len() as f64);
            }
            resources
        });
        let node_name =
            Some(inputs.resolve_hostname()).filter(|name| validate_name("node_name", name).is_ok());
        let metadata = Self {
            pid: std::process::id().max(1),
            node_id,
            node_ip,
            gpu_ids,
            resources,
            node_name,
        };
        (metadata, warnings)
    }
}

/// The inputs of a probe: the environment and paths it reads, given as
/// values so tests feed their own without touching the process.
///
/// ```
/// use trainstate_manager::{ProbeInputs, WorkerMetadata};
///
/// let inputs = ProbeInputs::empty()
///     .with_env("CUDA_VISIBLE_DEVICES", "2,3")
///     .with_hostname("trainer-7");
/// let (metadata, warnings) = WorkerMetadata::probe_with_warnings(&inputs);
/// assert_eq!(metadata.gpu_ids, [2, 3]);
/// assert!(metadata.node_id.starts_with("host-"));
/// assert!(warnings.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ProbeInputs {
    /// Environment variables: only `CUDA_VISIBLE_DEVICES`,
    /// `NVIDIA_VISIBLE_DEVICES` and `HOSTNAME` are read.
    pub env: BTreeMap<String, String>,
    /// The machine-id file (`/etc/machine-id` for a real process).
    pub machine_id_path: Option<PathBuf>,
    /// Files holding the hostname, tried in order
    /// (`/proc/sys/kernel/hostname`, `/etc/hostname` for a real process).
    pub hostname_paths: Vec<PathBuf>,
    /// The hostname, when known; takes precedence over the files.
    pub hostname: Option<String>,
    /// The address of the head (the state actor's service), to find the
    /// interface that routes to it.
    pub head: Option<SocketAddr>,
    /// The node's address when it is configured rather than discovered
    /// (as Ray's `--node-ip-address`).
    pub node_ip: Option<IpAddr>,
    /// The resources allotted to the worker, when the scheduler says.
    pub resources: Option<Resources>,
}

impl ProbeInputs {
    /// No environment, no files, no head: every probe falls back.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The real inputs of this process: the GPU and hostname variables of
    /// its environment, `/etc/machine-id`, the hostname files, and `head`.
    ///
    /// For binaries; libraries and tests build their inputs by hand.
    pub fn from_process(head: Option<SocketAddr>) -> Self {
        let env = [CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, HOSTNAME]
            .into_iter()
            .filter_map(|key| {
                let value = std::env::var_os(key)?;
                Some((key.to_owned(), value.to_string_lossy().into_owned()))
            })
            .collect();
        Self {
            env,
            machine_id_path: Some("/etc/machine-id".into()),
            hostname_paths: vec!["/proc/sys/kernel/hostname".into(), "/etc/hostname".into()],
            hostname: None,
            head,
            node_ip: None,
            resources: None,
        }
    }

    /// Sets an environment variable of the inputs (not of the process).
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Reads the machine id from `path`.
    pub fn with_machine_id_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.machine_id_path = Some(path.into());
        self
    }

    /// Sets the hostname.
    pub fn with_hostname(mut self, hostname: impl Into<String>) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// Sets the head's address.
    pub fn with_head(mut self, head: SocketAddr) -> Self {
        self.head = Some(head);
        self
    }

    /// Sets the node's configured address.
    pub fn with_node_ip(mut self, ip: IpAddr) -> Self {
        self.node_ip = Some(ip);
        self
    }

    /// Sets the worker's allotted resources.
    pub fn with_resources(mut self, resources: Resources) -> Self {
        self.resources = Some(resources);
        self
    }

    /// The hostname: the given one, else the first non-empty hostname file,
    /// else `HOSTNAME`, else `localhost`.
    pub fn resolve_hostname(&self) -> String {
        let usable = |text: &str| {
            let text = text.trim();
            (!text.is_empty()).then(|| text.to_owned())
        };
        self.hostname
            .as_deref()
            .and_then(usable)
            .or_else(|| {
                self.hostname_paths
                    .iter()
                    .find_map(|path| std::fs::read_to_string(path).ok().and_then(|t| usable(&t)))
            })
            .or_else(|| self.env.get(HOSTNAME).and_then(|t| usable(t)))
            .unwrap_or_else(|| "localhost".to_owned())
    }
}

/// Something a probe could not find, and what it used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeWarning {
    /// No GPU ids could be read: the variable was unset, empty, hid every
    /// GPU, or named GPUs by UUID or MIG instance. The worker reports none.
    NoGpuIds {
        /// The variable read, if either was set.
        variable: Option<&'static str>,
        /// Its value, if it was set.
        value: Option<String>,
    },
    /// No interface routes to the head; the node reports loopback.
    NodeIpFallback {
        /// The head's address.
        head: SocketAddr,
        /// Why routing failed.
        reason: String,
    },
}

impl fmt::Display for ProbeWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeWarning::NoGpuIds { variable: None, .. } => write!(
                f,
                "neither {CUDA_VISIBLE_DEVICES} nor {NVIDIA_VISIBLE_DEVICES} is set; the worker reports no GPU ids"
            ),
            ProbeWarning::NoGpuIds { variable: Some(variable), value } => write!(
                f,
                "{variable}={:?} does not list GPU indexes; the worker reports no GPU ids",
                value.as_deref().unwrap_or("")
            ),
            ProbeWarning::NodeIpFallback { head, reason } => write!(
                f,
                "no interface routes to the head at {head} ({reason}); the node reports 127.0.0.1"
            ),
        }
    }
}

/// Reads a `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` value.
///
/// A comma-separated list of non-negative integers (spaces around them
/// allowed, repeats dropped) gives those ids. Anything else gives `None`:
/// empty, `-1`, `none`, `void`, `all`, GPU UUIDs (`GPU-…`) and MIG instances
/// (`MIG-…`) do not say which indexes the process sees.
///
/// ```
/// use trainstate_manager::parse_visible_devices;
///
/// assert_eq!(parse_visible_devices("0, 2,3"), Some(vec![0, 2, 3]));
/// assert_eq!(parse_visible_devices("all"), None);
/// assert_eq!(parse_visible_devices("GPU-5c8a1b2e-0000-0000-0000-000000000000"), None);
/// ```
pub fn parse_visible_devices(value: &str) -> Option<Vec<u32>> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let mut ids = Vec::new();
    for token in value.split(',') {
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let id: u32 = token.parse().ok()?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    (ids.len() <= MAX_GPUS_PER_WORKER).then_some(ids)
}

/// The FNV-1a 64-bit hash of `bytes`: stable across platforms and releases.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

fn node_id(inputs: &ProbeInputs) -> String {
    let machine_id = inputs
        .machine_id_path
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_owned())
        .filter(|id| validate_name("node_id", id).is_ok());
    machine_id
        .unwrap_or_else(|| format!("host-{:016x}", fnv1a64(inputs.resolve_hostname().as_bytes())))
}

/// The local address of the interface that routes to `head`: a UDP socket
/// connected to it (which sends nothing) reports the source address the
/// kernel chose.
fn route_to(head: SocketAddr) -> Result<IpAddr, String> {
    let any: SocketAddr = match head {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any).map_err(|e| e.to_string())?;
    socket.connect(head).map_err(|e| e.to_string())?;
    let ip = socket.local_addr().map_err(|e| e.to_string())?.ip();
    if ip.is_unspecified() {
        return Err("the kernel chose no source address".into());
    }
    Ok(ip)
}
