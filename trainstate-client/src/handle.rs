//! `StateHandle`: the typed async API to the state actor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::ActorRef;
use ractor::MessagingErr;
use tokio::sync::oneshot;
use tokio::time::Instant;
use trainstate_schema::api::{
    ProgressReport, ProgressResponse, RankProgress, RankReport, RendezvousResponse,
};
use trainstate_schema::{NewRun, RunId, TrainRunInfo, ray_v2};

use crate::document::RunDocument;
use crate::error::Reply;
use crate::error::StateError;
use crate::events::Subscription;
use crate::protocol::{
    DEFAULT_STATE_ACTOR_NAME, NewAttempt, PreparedChange, Registration, StateMessage, StatusUpdate,
};
use crate::query::{RunPage, RunQuery};
use crate::rendezvous::{Join, RankEnd, RendezvousMessage};

/// The deadline of a call when none is set.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How much a call's deadline grows per MiB of the document it carries
/// (a run, an attempt's workers, a Ray document): a large document takes
/// longer to check, encode and commit, and gets a deadline that fits it. A
/// 16 MiB run (the default body limit) gets 16 s more.
pub const DEADLINE_PER_MIB: Duration = Duration::from_secs(1);

/// What a deadline grows by for a document of `bytes` of JSON:
/// [`DEADLINE_PER_MIB`] per MiB, pro rata.
pub fn deadline_allowance(bytes: u64) -> Duration {
    DEADLINE_PER_MIB.mul_f64(bytes as f64 / (1024.0 * 1024.0))
}

/// The size of the JSON document a request carries, if it carries one.
fn document_bytes(message: &StateMessage) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = match message {
        StateMessage::Register { bytes: Some(bytes), .. } => {
            count.0 = *bytes;
            Ok(())
        }
        StateMessage::Register { run, .. } => serde_json::to_writer(&mut count, run.run()),
        StateMessage::StartAttempt { attempt, .. } => {
            serde_json::to_writer(&mut count, &attempt.workers)
        }
        StateMessage::UpsertRayRun { run, .. } => serde_json::to_writer(&mut count, run),
        StateMessage::UpsertRayAttempt { attempt, .. } => {
            serde_json::to_writer(&mut count, attempt)
        }
        StateMessage::Forward { run, .. } => serde_json::to_writer(&mut count, run),
        StateMessage::ReportProgress { report, .. } => serde_json::to_writer(&mut count, report),
        StateMessage::PostStacks { request, .. } => serde_json::to_writer(&mut count, request),
        StateMessage::UpsertRayPrepared { bytes, .. } => {
            count.0 = *bytes;
            Ok(())
        }
        _ => Ok(()),
    };
    count.0
}

/// How long a handle waits between looks for an actor that is restarting.
const RELOOK_INTERVAL: Duration = Duration::from_millis(5);

/// The state actor registered under the default name, if one runs in this
/// process. Never launches one.
pub fn get_state_actor() -> Option<StateHandle> {
    get_state_actor_named(DEFAULT_STATE_ACTOR_NAME)
}

/// The state actor registered under `name`, if one runs in this process.
/// Never launches one.
pub fn get_state_actor_named(name: &str) -> Option<StateHandle> {
    let actor = ActorRef::<StateMessage>::where_is(name)?;
    Some(StateHandle::local_with(name, Some(actor)))
}

/// The one typed async API to the state actor.
///
/// Cheap to clone. A local handle finds the actor by its registry name and
/// finds it again after a restart (a restarted actor is a new actor); a
/// request that was in flight when the actor stopped fails with
/// [`StateError::Unavailable`] rather than hanging. Every call has a
/// deadline ([`StateHandle::with_timeout`], plus [`deadline_allowance`]
/// for the document a write carries) and fails with
/// [`StateError::Timeout`] past it: a write may then have taken effect.
#[derive(Clone)]
pub struct StateHandle {
    inner: Arc<Transport>,
    timeout: Duration,
}

enum Transport {
    Local(Local),
    #[cfg(feature = "http")]
    Remote(crate::remote::Remote),
}

struct Local {
    name: String,
    actor: Mutex<Option<ActorRef<StateMessage>>>,
}

impl std::fmt::Debug for StateHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateHandle")
            .field("target", &self.name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl StateHandle {
    /// A handle to the actor registered under `name` in this process. The
    /// actor need not run yet: calls wait for it up to their deadline.
    pub fn local(name: impl Into<String>) -> Self {
        Self::local_with(&name.into(), None)
    }

    fn local_with(name: &str, actor: Option<ActorRef<StateMessage>>) -> Self {
        Self {
            inner: Arc::new(Transport::Local(Local {
                name: name.to_owned(),
                actor: Mutex::new(actor),
            })),
            timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// A handle to the state actor behind the head service at `url` (for
    /// example `http://head:8266`), with the bearer `token` the head
    /// requires for writes, if any. Nothing is sent until the first call.
    ///
    /// The same typed API as a local handle. Every request of the API is
    /// idempotent, so a request is retried with backoff while the head is
    /// unreachable or busy, up to the call's deadline. Subscriptions and
    /// sweeps are local only; over HTTP, use `GET /api/train/events`.
    ///
    /// An `https://` URL needs the `rustls` feature, and trusts the
    /// system's roots; [`StateHandle::connect_with_ca`] trusts given CAs
    /// instead.
    #[cfg(feature = "http")]
    pub fn connect(url: &str, token: Option<String>) -> Result<Self, StateError> {
        #[cfg(feature = "rustls")]
        let remote = crate::remote::Remote::new(url, token, None)?;
        #[cfg(not(feature = "rustls"))]
        let remote = crate::remote::Remote::new(url, token)?;
        Ok(Self { inner: Arc::new(Transport::Remote(remote)), timeout: DEFAULT_CALL_TIMEOUT })
    }

    /// [`StateHandle::connect`] to an `https://` head whose certificate
    /// one of `cas` signed: only they are trusted, not the system's roots.
    /// With `None`, the same as [`StateHandle::connect`]. CAs given for an
    /// `http://` URL are refused (`ca_cert`), as they would go unused.
    #[cfg(feature = "rustls")]
    pub fn connect_with_ca(
        url: &str,
        token: Option<String>,
        cas: Option<&crate::TrustedCas>,
    ) -> Result<Self, StateError> {
        let remote = crate::remote::Remote::new(url, token, cas)?;
        Ok(Self { inner: Arc::new(Transport::Remote(remote)), timeout: DEFAULT_CALL_TIMEOUT })
    }

    /// The same handle with another deadline for each call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The registry name of the actor this handle talks to, or the URL of
    /// the head for a remote handle.
    pub fn name(&self) -> &str {
        match &*self.inner {
            Transport::Local(local) => &local.name,
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.base(),
        }
    }

    /// True for a handle over HTTP.
    pub fn is_remote(&self) -> bool {
        !matches!(&*self.inner, Transport::Local(_))
    }

    /// Registers a run; see [`StateMessage::Register`].
    ///
    /// Takes a validated run or a [`NewRun`] normalised already; either is
    /// validated no more.
    pub async fn register(&self, run: impl Into<NewRun>) -> Result<Registration, StateError> {
        let run = Box::new(run.into());
        self.call(|reply| StateMessage::Register { run, bytes: None, reply }).await
    }

    /// [`StateHandle::register`] of a run received as `bytes` of JSON (an
    /// HTTP body), which size the call's deadline.
    pub async fn register_received(
        &self,
        run: NewRun,
        bytes: u64,
    ) -> Result<Registration, StateError> {
        let run = Box::new(run);
        self.call(|reply| StateMessage::Register { run, bytes: Some(bytes), reply }).await
    }

    /// Sets a run's status; see [`StateMessage::SetStatus`].
    pub async fn set_status(
        &self,
        id: RunId,
        update: StatusUpdate,
    ) -> Result<RunDocument, StateError> {
        self.call(|reply| StateMessage::SetStatus { id, update, reply }).await
    }

    /// Starts a new attempt of a run; see [`StateMessage::StartAttempt`].
    pub async fn start_attempt(
        &self,
        id: RunId,
        attempt: NewAttempt,
    ) -> Result<RunDocument, StateError> {
        self.call(|reply| StateMessage::StartAttempt { id, attempt, reply }).await
    }

    /// Creates or updates a run from Ray Train V2's whole run document; see
    /// [`StateMessage::UpsertRayRun`].
    pub async fn upsert_ray_run(&self, run: ray_v2::TrainRun) -> Result<RunDocument, StateError> {
        self.upsert_ray_run_at(run, None).await
    }

    /// [`upsert_ray_run`](Self::upsert_ray_run), as changed at `at_ms`
    /// (Unix ms) when the writer knows when (Ray's time of an export
    /// event): the time the run's status history records, and the end of
    /// a run that ends without one.
    pub async fn upsert_ray_run_at(
        &self,
        run: ray_v2::TrainRun,
        at_ms: Option<u64>,
    ) -> Result<RunDocument, StateError> {
        let run = Box::new(run);
        self.call(|reply| StateMessage::UpsertRayRun { run, at_ms, reply }).await
    }

    /// Creates or updates an attempt from Ray Train V2's whole attempt
    /// document; see [`StateMessage::UpsertRayAttempt`].
    pub async fn upsert_ray_attempt(
        &self,
        attempt: ray_v2::TrainRunAttempt,
    ) -> Result<RunDocument, StateError> {
        self.upsert_ray_attempt_at(attempt, None).await
    }

    /// [`upsert_ray_attempt`](Self::upsert_ray_attempt), as changed at
    /// `at_ms` (Unix ms) when the writer knows when; see
    /// [`upsert_ray_run_at`](Self::upsert_ray_run_at).
    pub async fn upsert_ray_attempt_at(
        &self,
        attempt: ray_v2::TrainRunAttempt,
        at_ms: Option<u64>,
    ) -> Result<RunDocument, StateError> {
        let attempt = Box::new(attempt);
        self.call(|reply| StateMessage::UpsertRayAttempt { attempt, at_ms, reply }).await
    }

    /// Sends a Ray Train V2 write prepared off the actor's turn; see
    /// [`StateMessage::UpsertRayPrepared`]. `None`: the run changed since
    /// it was prepared. A local handle's only.
    pub async fn upsert_ray_prepared(
        &self,
        prepared: PreparedChange,
        bytes: u64,
    ) -> Result<Option<RunDocument>, StateError> {
        self.call(|reply| StateMessage::UpsertRayPrepared { prepared, bytes, reply }).await
    }

    /// The link templates the head service serves (`GET /api/links`): a
    /// remote handle's only; a local handle has no head service.
    pub async fn links(&self) -> Result<crate::api::LinksResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.links(self.timeout).await,
            Transport::Local(_) => Err(StateError::Unsupported {
                reason: "link templates are the head service's; connect to it over HTTP".into(),
            }),
        }
    }

    /// Creates a bearer token on the head service (`POST /api/tokens`; the
    /// handle's token needs the scope `admin`). The answer holds the secret,
    /// which the head never shows again. A remote handle's only.
    ///
    /// The call makes a random idempotency key and sends it with every try,
    /// so retries after a lost answer create one token, not two.
    pub async fn create_token(
        &self,
        request: &crate::api::CreateTokenRequest,
    ) -> Result<crate::api::CreateTokenResponse, StateError> {
        // Two UUID v7: 148 random bits, as 64 hex digits.
        let key = format!("{}{}", RunId::new_v7(), RunId::new_v7());
        self.create_token_with_key(request, &key).await
    }

    /// [`StateHandle::create_token`] with the caller's idempotency key
    /// (16 to 128 visible ASCII characters, best random): a repeat with
    /// the same key and request, even from another process, answers the
    /// token the first created, with its secret; with another request, a
    /// `Conflict`.
    #[cfg_attr(not(feature = "http"), allow(unused_variables))]
    pub async fn create_token_with_key(
        &self,
        request: &crate::api::CreateTokenRequest,
        idempotency_key: &str,
    ) -> Result<crate::api::CreateTokenResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => {
                remote.create_token(request, idempotency_key, self.timeout).await
            }
            Transport::Local(_) => Err(tokens_are_remote()),
        }
    }

    /// The node ledger (`GET /api/train/nodes`). A remote handle's only.
    #[cfg_attr(not(feature = "http"), allow(unused_variables))]
    pub async fn list_nodes(
        &self,
        query: &crate::api::NodesQuery,
    ) -> Result<crate::api::NodeListResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.list_nodes(query, self.timeout).await,
            Transport::Local(_) => Err(nodes_are_remote()),
        }
    }

    /// The fleet's goodput: every retained run's time summed by cluster,
    /// node or run name over a window (`GET /api/train/goodput`), answered
    /// from the committed view in process or over HTTP.
    pub async fn goodput(
        &self,
        query: crate::api::GoodputQuery,
    ) -> Result<crate::api::GoodputResponse, StateError> {
        self.call(|reply| StateMessage::Goodput { query, reply }).await
    }

    /// One node of the ledger with the runs behind its counts
    /// (`GET /api/train/nodes/{node}`). A remote handle's only.
    #[cfg_attr(not(feature = "http"), allow(unused_variables))]
    pub async fn get_node(
        &self,
        node: &str,
        query: &crate::api::NodeQuery,
    ) -> Result<crate::api::NodeDetailResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.get_node(node, query, self.timeout).await,
            Transport::Local(_) => Err(nodes_are_remote()),
        }
    }

    /// The stack captures of run `id`, newest first
    /// (`GET /api/train/runs/{id}/stacks`), each with every rank: a pending
    /// capture with the ranks that answered so far. In process, the actor
    /// checks that the run is committed and the captures are read from the
    /// store on a connection of its own, off the actor's turn.
    pub async fn run_stacks(&self, id: &RunId) -> Result<crate::api::StacksResponse, StateError> {
        let id = id.clone();
        self.call(|reply| StateMessage::GetStacks { id, reply }).await
    }

    /// Posts to run `id`'s stack captures (`POST .../stacks`): with no
    /// ranks, asks its ranks for their stacks (the capture opened); with
    /// `capture_id` and ranks, their answer; with ranks alone, a
    /// controller's own capture. Answers the capture as it now stands.
    pub async fn post_stacks(
        &self,
        id: &RunId,
        request: crate::api::StacksRequest,
    ) -> Result<crate::api::StackCapture, StateError> {
        let id = id.clone();
        let request = Box::new(request);
        self.call(|reply| StateMessage::PostStacks { id, request, reply }).await.map(|(c, _)| c)
    }

    /// Every token of the head service (`GET /api/tokens`), without secrets.
    /// A remote handle's only.
    pub async fn list_tokens(&self) -> Result<crate::api::TokenListResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.list_tokens(self.timeout).await,
            Transport::Local(_) => Err(tokens_are_remote()),
        }
    }

    /// Revokes a token of the head service (`DELETE /api/tokens/{id}`) and
    /// answers it as revoked. A remote handle's only.
    #[cfg_attr(not(feature = "http"), allow(unused_variables))]
    pub async fn revoke_token(&self, id: &str) -> Result<crate::api::TokenInfo, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.revoke_token(id, self.timeout).await,
            Transport::Local(_) => Err(tokens_are_remote()),
        }
    }

    /// What the head service says it is (`GET /api/version`): a remote
    /// handle's only. An answer that is not a trainstate head's is an
    /// error ([`StateError::NoSuchRoute`] for a 404, else
    /// [`StateError::Protocol`]), so this checks that the URL is a head's.
    pub async fn head_version(&self) -> Result<crate::api::VersionResponse, StateError> {
        match &*self.inner {
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.version(self.timeout).await,
            Transport::Local(_) => Err(StateError::Unsupported {
                reason: "a local handle has no head service; connect to it over HTTP".into(),
            }),
        }
    }

    /// Renews a live run's lease and returns it.
    pub async fn heartbeat(&self, id: RunId) -> Result<Duration, StateError> {
        self.call(|reply| StateMessage::Heartbeat { id, reply }).await
    }

    /// Reports where the training loop of some ranks of run `id` is, as
    /// the run's controller sees it: each `(rank, progress)` of
    /// `attempt_id` (the run's current attempt when `None`). The head
    /// serves it as the run's `rank_progress` and metric histories and
    /// decides the run's health from it; it renews the run's lease, like a
    /// heartbeat. A report that breaks a rule is refused whole
    /// ([`StateError::Invalid`], naming the field:
    /// `ranks[2].progress.metrics["loss"]`); a step lower than the rank's
    /// previous one, a rank that is not one of the attempt's workers, an
    /// attempt that is not the current one or an ended run is refused
    /// ([`StateError::Conflict`] or [`StateError::IllegalTransition`]), and
    /// nothing of it is recorded.
    pub async fn report_progress(
        &self,
        id: &RunId,
        attempt_id: Option<String>,
        ranks: Vec<(u32, RankProgress)>,
    ) -> Result<ProgressResponse, StateError> {
        let ranks = ranks.into_iter().map(|(rank, progress)| RankReport::new(rank, progress));
        let mut report = ProgressReport::new(ranks.collect());
        report.attempt_id = attempt_id;
        report.check()?;
        let (id, report) = (id.clone(), Box::new(report));
        self.call(|reply| StateMessage::ReportProgress { id, report, reply }).await
    }

    /// Reads one run as stored.
    pub async fn get(&self, id: RunId) -> Result<RunDocument, StateError> {
        self.call(|reply| StateMessage::Get { id, reply }).await
    }

    /// Reads one run, typed.
    pub async fn get_run(&self, id: RunId) -> Result<TrainRunInfo, StateError> {
        self.get(id).await?.parse()
    }

    /// Lists runs; see [`RunQuery`].
    pub async fn list(&self, query: RunQuery) -> Result<RunPage, StateError> {
        query.check()?;
        self.call(|reply| StateMessage::List { query, reply }).await
    }

    /// Subscribes to committed changes, resuming after `after_seq` if the
    /// actor still keeps those events.
    pub async fn subscribe(&self, after_seq: Option<u64>) -> Result<Subscription, StateError> {
        self.call(|reply| StateMessage::Subscribe { after_seq, reply }).await
    }

    /// Deletes an ended run.
    pub async fn delete(&self, id: RunId) -> Result<(), StateError> {
        self.call(|reply| StateMessage::Delete { id, reply }).await
    }

    /// Stores `run`, forwarded from the head of another cluster, as it is:
    /// what a head's forwarding calls on its hub. Repeating it is a no-op;
    /// a run never goes back to an earlier state, and its static metadata
    /// and cluster never change.
    pub async fn forward(&self, run: TrainRunInfo) -> Result<RunDocument, StateError> {
        let run = Box::new(run);
        self.call(|reply| StateMessage::Forward { run, reply }).await
    }

    /// Runs the liveness sweep now and returns the runs it aborted.
    pub async fn sweep_leases(&self) -> Result<Vec<RunId>, StateError> {
        self.call(|reply| StateMessage::SweepLeases { reply }).await
    }

    /// Decides now the health of the live runs whose health may change (a
    /// stall a rank's advance ended, a stall window just passed), as the
    /// head does about once a second; answers how many runs it decided.
    pub async fn decide_health(&self) -> Result<usize, StateError> {
        self.call(|reply| StateMessage::DecideHealth { reply }).await
    }

    /// Sends one request and waits for its answer, up to the deadline: the
    /// one place where a call goes to the local actor or over HTTP.
    pub(crate) async fn call<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> StateMessage,
    ) -> Result<T, StateError> {
        let started = Instant::now();
        let (tx, rx) = oneshot::channel();
        let message = make(Reply::from(tx));
        let timeout = self.timeout + deadline_allowance(document_bytes(&message));
        let deadline = started + timeout;
        match &*self.inner {
            Transport::Local(local) => local.deliver(message, deadline).await?,
            #[cfg(feature = "http")]
            Transport::Remote(remote) => remote.answer(message, timeout).await,
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StateError::unavailable(
                "the state actor stopped before answering; the request may or may not have taken effect",
            )),
            Err(_) => Err(StateError::Timeout { after: timeout }),
        }
    }
}

impl Local {
    /// Delivers a message to the actor registered under the name, waiting
    /// for one to run up to `deadline`.
    ///
    /// A message that could not be delivered (the actor stopped) is sent
    /// again, unchanged, to the actor found under the same name, so a
    /// restart between lookup and send costs nothing. A message that was
    /// delivered is never sent twice.
    async fn deliver(
        &self,
        mut message: StateMessage,
        deadline: Instant,
    ) -> Result<(), StateError> {
        loop {
            let Some(actor) = self.actor() else {
                if Instant::now() >= deadline {
                    return Err(StateError::unavailable(format!(
                        "no state actor named {:?} is running",
                        self.name
                    )));
                }
                tokio::time::sleep(RELOOK_INTERVAL).await;
                continue;
            };
            match actor.send_message(message) {
                Ok(()) => return Ok(()),
                Err(MessagingErr::SendErr(returned)) => {
                    self.forget(&actor);
                    message = returned;
                }
                Err(_) => {
                    return Err(StateError::unavailable("the state actor's mailbox is closed"));
                }
            }
        }
    }

    /// The cached actor, or the one registered under the name now.
    fn actor(&self) -> Option<ActorRef<StateMessage>> {
        let local = self;
        let mut cached = local.actor.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(actor) = cached.as_ref() {
            return Some(actor.clone());
        }
        let found = ActorRef::<StateMessage>::where_is(local.name.clone());
        cached.clone_from(&found);
        found
    }

    fn forget(&self, stale: &ActorRef<StateMessage>) {
        let mut cached = self.actor.lock().unwrap_or_else(|e| e.into_inner());
        if cached.as_ref().is_some_and(|a| a.get_id() == stale.get_id()) {
            *cached = None;
        }
    }
}

/// The error of the node ledger on a local handle.
fn nodes_are_remote() -> StateError {
    StateError::Unsupported {
        reason: "the node ledger is the head service's; connect to it over HTTP".into(),
    }
}

/// The error of token administration on a local handle.
fn tokens_are_remote() -> StateError {
    StateError::Unsupported {
        reason: "tokens are the head service's; connect to it over HTTP".into(),
    }
}

// The rendezvous, for launches without a controller (`rendezvous.rs`).
impl StateHandle {
    /// Joins `join.worker` into the rendezvous group of `join.key`.
    ///
    /// The answer says the run id (assigned at the group's first join, the
    /// same for every rank) and whether the run is registered yet
    /// (`run_status` is null while ranks are missing). The join that
    /// completes the group is answered once the run (or its new attempt)
    /// is committed. Repeating a join is a no-op; a second process for the
    /// same rank, a world size that disagrees with the group's, a join into
    /// a group that has closed or a run that has ended is refused
    /// ([`StateError::Refused`]).
    pub async fn join_rendezvous(&self, join: Join) -> Result<RendezvousResponse, StateError> {
        self.join_rendezvous_from(join, None).await
    }

    /// [`Self::join_rendezvous`] for a join that came from `client` (an
    /// address, as a head's HTTP service saw it).
    pub async fn join_rendezvous_from(
        &self,
        join: Join,
        client: Option<String>,
    ) -> Result<RendezvousResponse, StateError> {
        let join = Box::new(join);
        self.call(|reply| StateMessage::Rendezvous(RendezvousMessage::Join { join, client, reply }))
            .await
    }

    /// Says rank `rank` of `attempt_id` is alive: renews the run's lease and
    /// records when the rank was last heard from (in memory only).
    pub async fn heartbeat_rank(
        &self,
        id: RunId,
        rank: u32,
        attempt_id: impl Into<String>,
    ) -> Result<RendezvousResponse, StateError> {
        let attempt_id = attempt_id.into();
        self.call(|reply| {
            StateMessage::Rendezvous(RendezvousMessage::Heartbeat {
                id,
                rank,
                attempt_id,
                progress: None,
                reply,
            })
        })
        .await
    }

    /// Says rank `rank` of `attempt_id` is alive, as
    /// [`heartbeat_rank`](Self::heartbeat_rank), and where its training
    /// loop is: its step, phase and latest metrics, from which the head
    /// decides the run's health. A report that breaks a rule is refused
    /// ([`StateError::Invalid`], naming the field) and nothing is recorded;
    /// a step lower than the rank's previous one is refused
    /// ([`StateError::Conflict`]).
    pub async fn heartbeat_rank_with_progress(
        &self,
        id: RunId,
        rank: u32,
        attempt_id: impl Into<String>,
        progress: RankProgress,
    ) -> Result<RendezvousResponse, StateError> {
        progress.check()?;
        let attempt_id = attempt_id.into();
        let progress = Some(Box::new(progress));
        self.call(|reply| {
            StateMessage::Rendezvous(RendezvousMessage::Heartbeat {
                id,
                rank,
                attempt_id,
                progress,
                reply,
            })
        })
        .await
    }

    /// Reports how rank `rank` ended. The run finishes once every rank of
    /// its current attempt has finished, and errors (or aborts) at the first
    /// rank that errored (or was interrupted) with no restart to come. An
    /// end that ends the run is answered once committed.
    pub async fn end_rank(
        &self,
        id: RunId,
        rank: u32,
        end: RankEnd,
    ) -> Result<RendezvousResponse, StateError> {
        self.call(|reply| StateMessage::Rendezvous(RendezvousMessage::End { id, rank, end, reply }))
            .await
    }
}
