//! A notification target as the operator gives it: a URL whose fragment
//! (the part after `#`, which is never sent) carries the target's options,
//! `https://hooks.example/x#events=errored,stalled&cluster=a,b&run_name=bert-*&target=oncall`.
//! `classes=` and `causes=` choose among failures by whose fault they were
//! ([`CauseFilter`]).
//!
//! Parsing refuses what cannot work (no URL, another scheme than `http` or
//! `https`, no host, an unknown option or event name, a bad value), naming
//! what is wrong; the message never shows the URL's path, query or user
//! information, which may be secret (a Slack webhook's path is its key).

use std::collections::BTreeSet;
use std::time::Duration;

use trainstate_schema::api::{NotifyEventKind, NotifyTargetKind};
use trainstate_schema::{CauseClass, CauseKind};

use super::events::Fault;

/// The events a target sends when its URL names none: those that need
/// people. `finished` is asked for by name.
pub const DEFAULT_EVENTS: [EventChoice; 4] =
    [EventChoice::Errored, EventChoice::Aborted, EventChoice::Stalled, EventChoice::Restarting];

/// How often an Alertmanager target sends its firing alerts again by
/// default: Alertmanager resolves an alert that is not sent again before
/// its `endsAt`.
pub const DEFAULT_RESEND: Duration = Duration::from_secs(60);

/// The shortest and longest `resend` an Alertmanager target may ask for.
const RESEND_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));

/// The longest target name.
const MAX_TARGET_NAME_LEN: usize = 64;

/// The options a target's fragment may carry.
const OPTIONS: [&str; 7] =
    ["events", "cluster", "run_name", "target", "resend", "classes", "causes"];

/// An event a target may choose, as the operator spells it (lower case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum EventChoice {
    /// The run ended with an error.
    Errored,
    /// The run was stopped before it finished.
    Aborted,
    /// The run ended successfully.
    Finished,
    /// The run stalled, and when it recovers.
    Stalled,
    /// The run started a new attempt.
    Restarting,
}

impl EventChoice {
    /// Every choice, in the order the docs list them.
    pub const ALL: [EventChoice; 5] = [
        EventChoice::Errored,
        EventChoice::Aborted,
        EventChoice::Finished,
        EventChoice::Stalled,
        EventChoice::Restarting,
    ];

    /// The spelling an operator writes, for example `stalled`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventChoice::Errored => "errored",
            EventChoice::Aborted => "aborted",
            EventChoice::Finished => "finished",
            EventChoice::Stalled => "stalled",
            EventChoice::Restarting => "restarting",
        }
    }

    /// The event kinds this choice sends.
    fn kinds(self) -> &'static [NotifyEventKind] {
        match self {
            EventChoice::Errored => &[NotifyEventKind::Errored],
            EventChoice::Aborted => &[NotifyEventKind::Aborted],
            EventChoice::Finished => &[NotifyEventKind::Finished],
            EventChoice::Stalled => &[NotifyEventKind::Stalled, NotifyEventKind::Recovered],
            EventChoice::Restarting => &[NotifyEventKind::Restarting],
        }
    }
}

/// Why a target's URL is refused. Each message names the rule broken; the
/// flag is named by the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The text is no URL.
    #[error("not a URL ({0})")]
    NotAUrl(String),
    /// Another scheme than `http` or `https`.
    #[error("the URL must start with http:// or https://, not {0}://")]
    Scheme(String),
    /// No host.
    #[error("the URL names no host")]
    NoHost,
    /// An option the fragment may not carry.
    #[error("unknown option {name:?} after '#'; known: {}", OPTIONS.join(", "))]
    UnknownOption {
        /// The option as written.
        name: String,
    },
    /// The same option twice.
    #[error("option {0:?} is given twice")]
    RepeatedOption(String),
    /// An event name no target knows.
    #[error("unknown event {name:?} in events=; known: {}", EventChoice::ALL.map(EventChoice::as_str).join(", "))]
    UnknownEvent {
        /// The name as written.
        name: String,
    },
    /// A cause class no cause has.
    #[error("unknown class {name:?} in classes=; known: {}", known_classes())]
    UnknownClass {
        /// The name as written.
        name: String,
    },
    /// A cause kind no cause has.
    #[error("unknown cause {name:?} in causes=; known: {}", known_kinds())]
    UnknownCause {
        /// The name as written (without its `!`).
        name: String,
    },
    /// An option whose value breaks its rule.
    #[error("{option}={value:?}: {rule}")]
    BadValue {
        /// The option.
        option: &'static str,
        /// Its value as written.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
}

/// A run name pattern: `*` matches any text (none included), every other
/// character itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamePattern {
    text: String,
}

impl NamePattern {
    fn new(text: &str) -> Self {
        Self { text: text.to_owned() }
    }

    /// The pattern as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// True when `name` matches the whole pattern.
    pub(crate) fn matches(&self, name: &str) -> bool {
        let mut parts = self.text.split('*');
        let first = parts.next().unwrap_or("");
        let Some(mut rest) = name.strip_prefix(first) else { return false };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else {
            // No `*`: the name is the pattern.
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// One notification target: where it sends, in which format, which events
/// of which runs. Its `Debug` shows the URL as [`NotifyTarget::shown_url`]
/// does, so that no log or panic message carries a secret.
#[derive(Clone)]
pub struct NotifyTarget {
    pub(crate) name: String,
    pub(crate) kind: NotifyTargetKind,
    /// Where requests go (for Alertmanager, its `/api/v2/alerts`).
    pub(crate) url: url::Url,
    /// The event kinds it sends.
    pub(crate) kinds: BTreeSet<NotifyEventKind>,
    /// Only runs of these clusters; empty: every run.
    pub(crate) clusters: Vec<String>,
    pub(crate) run_name: Option<NamePattern>,
    /// How often firing alerts are sent again (Alertmanager only).
    pub(crate) resend: Duration,
    /// Which failures it tells of, by their cause.
    pub(crate) causes: CauseFilter,
}

impl std::fmt::Debug for NotifyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyTarget")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("url", &self.shown_url())
            .field("kinds", &self.kinds)
            .field("clusters", &self.clusters)
            .field("run_name", &self.run_name)
            .field("resend", &self.resend)
            .field("causes", &self.causes)
            .finish()
    }
}

impl NotifyTarget {
    /// Parses the target of `kind` that `text` (a URL, options in its
    /// fragment) describes.
    pub fn parse(kind: NotifyTargetKind, text: &str) -> Result<Self, TargetError> {
        let mut url =
            url::Url::parse(text.trim()).map_err(|e| TargetError::NotAUrl(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(TargetError::Scheme(url.scheme().to_owned()));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(TargetError::NoHost);
        }
        let fragment = url.fragment().unwrap_or("").to_owned();
        url.set_fragment(None);
        let mut seen = BTreeSet::new();
        let mut choices: Option<BTreeSet<EventChoice>> = None;
        let mut clusters = Vec::new();
        let mut run_name = None;
        let mut name = None;
        let mut resend = DEFAULT_RESEND;
        let mut causes = CauseFilter::default();
        for (option, value) in form_urlencoded::parse(fragment.as_bytes()) {
            let option = option.into_owned();
            let value = value.into_owned();
            if !OPTIONS.contains(&option.as_str()) {
                return Err(TargetError::UnknownOption { name: option });
            }
            if !seen.insert(option.clone()) {
                return Err(TargetError::RepeatedOption(option));
            }
            match option.as_str() {
                "events" => choices = Some(parse_events(&value)?),
                "cluster" => clusters = parse_clusters(&value)?,
                "run_name" => run_name = Some(parse_run_name(&value)?),
                "target" => name = Some(parse_target_name(&value)?),
                "classes" => causes.classes = Some(parse_classes(&value)?),
                "causes" => causes.kinds = Some(parse_kinds(&value)?),
                _ => resend = parse_resend(kind, &value)?,
            }
        }
        let kinds = choices
            .unwrap_or_else(|| DEFAULT_EVENTS.into_iter().collect())
            .into_iter()
            .flat_map(|choice| choice.kinds().iter().copied())
            .collect();
        if kind == NotifyTargetKind::Alertmanager && !url.path().ends_with("/api/v2/alerts") {
            let path = format!("{}/api/v2/alerts", url.path().trim_end_matches('/'));
            url.set_path(&path);
        }
        let name = name.unwrap_or_else(|| default_name(kind, &url));
        Ok(Self { name, kind, url, kinds, clusters, run_name, resend, causes })
    }

    /// The target's name: its label in metrics, its key in the store.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it is.
    pub fn kind(&self) -> NotifyTargetKind {
        self.kind
    }

    /// Where it sends, without secrets: the scheme, host and port only
    /// (`https://hooks.example.com:443/…`), for every kind of target. A
    /// webhook's path is where Slack, Discord, Teams and relays keep their
    /// key, and a query or user information may hold one too, so none of
    /// them is ever shown; `/…` says that something was left out.
    pub fn shown_url(&self) -> String {
        shown_url(&self.url)
    }

    /// The parts of `text` that [`Self::shown_url`] leaves out (the user
    /// information, the path beyond `/`, the query), each replaced by `…`:
    /// for a receiver's answer, which may echo the request it took.
    pub(crate) fn without_secrets(&self, text: &str) -> String {
        let url = &self.url;
        let mut secrets: Vec<&str> =
            vec![url.username(), url.password().unwrap_or(""), url.query().unwrap_or("")];
        if url.path() != "/" {
            secrets.push(url.path());
        }
        secrets.retain(|s| !s.is_empty());
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.into_iter().fold(text.to_owned(), |text, secret| text.replace(secret, "…"))
    }

    /// The event kinds it sends, in [`NotifyEventKind::ALL`]'s order.
    pub fn events(&self) -> Vec<NotifyEventKind> {
        self.kinds.iter().copied().collect()
    }

    /// True when a run of `cluster` named `name` is one the target tells of.
    pub(crate) fn covers(&self, cluster: Option<&str>, name: &str) -> bool {
        (self.clusters.is_empty() || cluster.is_some_and(|c| self.clusters.iter().any(|x| x == c)))
            && self.run_name.as_ref().is_none_or(|pattern| pattern.matches(name))
    }
}

/// Which failures a target tells of, by their cause: `classes=` (the
/// classes it sends) and `causes=` (the kinds it sends, or with `!` the
/// kinds it leaves out). Without either, every event passes.
///
/// An event is judged by the cause it tells of: an end's, or for a
/// restart the cause of the attempt that ended. A stall (and its
/// recovery) has no cause: it counts as class `no_progress` and of no
/// kind. A list of what to send (`classes=`, `causes=` without `!`) sends
/// only what is known to be on it, so it drops an end of no cause (a
/// record older than causes, an abort no one explained); a list of what
/// to leave out (`causes=!preempted`) drops only what is known to be on
/// it. A `FINISHED` event is no failure and passes every filter: it is
/// sent only to a target whose `events=` names it, and that operator
/// asked for it by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CauseFilter {
    /// `classes=`: the classes sent; `None`: every class.
    pub(crate) classes: Option<BTreeSet<CauseClass>>,
    /// `causes=`: the kinds sent or left out; `None`: every kind.
    pub(crate) kinds: Option<KindFilter>,
}

/// The kinds `causes=` names: those sent, or (`!name`) those left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KindFilter {
    /// Only events whose cause is of one of these kinds.
    Only(BTreeSet<CauseKind>),
    /// Every event but those whose cause is of one of these kinds.
    Except(BTreeSet<CauseKind>),
}

impl CauseFilter {
    /// True when an event of `kind` judged by `fault` passes.
    pub(crate) fn passes(&self, kind: NotifyEventKind, fault: Fault) -> bool {
        if kind == NotifyEventKind::Finished {
            return true;
        }
        let class_passes = self
            .classes
            .as_ref()
            .is_none_or(|classes| fault.class.is_some_and(|c| classes.contains(&c)));
        let kind_passes = match &self.kinds {
            None => true,
            Some(KindFilter::Only(kinds)) => fault.kind.is_some_and(|k| kinds.contains(&k)),
            Some(KindFilter::Except(kinds)) => fault.kind.is_none_or(|k| !kinds.contains(&k)),
        };
        class_passes && kind_passes
    }
}

/// Every class, as an operator writes it.
fn known_classes() -> String {
    CauseClass::ALL.map(|c| c.as_str().to_ascii_lowercase()).join(", ")
}

/// Every kind, as an operator writes it.
fn known_kinds() -> String {
    CauseKind::ALL.map(|k| k.as_str().to_ascii_lowercase()).join(", ")
}

/// `url` shown without secrets: `scheme://host:port`, followed by `/…` when
/// it has a path beyond `/` or a query (see [`NotifyTarget::shown_url`]).
fn shown_url(url: &url::Url) -> String {
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        Some(host) => host.to_string(),
        None => String::new(),
    };
    let port = url.port_or_known_default().map(|p| format!(":{p}")).unwrap_or_default();
    let hidden = url.path() != "/" || url.query().is_some();
    format!("{}://{host}{port}{}", url.scheme(), if hidden { "/…" } else { "" })
}

/// `<kind>-<host>[:<port>]`: a name that stays the same while the URL's
/// host does.
fn default_name(kind: NotifyTargetKind, url: &url::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{kind}-{host}:{port}"),
        None => format!("{kind}-{host}"),
    }
}

fn parse_events(value: &str) -> Result<BTreeSet<EventChoice>, TargetError> {
    let mut choices = BTreeSet::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let lower = name.to_ascii_lowercase();
        let choice = EventChoice::ALL
            .into_iter()
            .find(|c| c.as_str() == lower)
            .ok_or_else(|| TargetError::UnknownEvent { name: name.to_owned() })?;
        choices.insert(choice);
    }
    if choices.is_empty() {
        return Err(TargetError::BadValue {
            option: "events",
            value: value.to_owned(),
            rule: "name at least one event".into(),
        });
    }
    Ok(choices)
}

fn parse_classes(value: &str) -> Result<BTreeSet<CauseClass>, TargetError> {
    let mut classes = BTreeSet::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let class = CauseClass::parse(name)
            .ok_or_else(|| TargetError::UnknownClass { name: name.to_owned() })?;
        classes.insert(class);
    }
    if classes.is_empty() {
        return Err(TargetError::BadValue {
            option: "classes",
            value: value.to_owned(),
            rule: format!("name at least one class of {}", known_classes()),
        });
    }
    Ok(classes)
}

fn parse_kinds(value: &str) -> Result<KindFilter, TargetError> {
    let bad =
        |rule: String| TargetError::BadValue { option: "causes", value: value.to_owned(), rule };
    let mut sent = BTreeSet::new();
    let mut left_out = BTreeSet::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (negated, bare) = match name.strip_prefix('!') {
            Some(bare) => (true, bare.trim()),
            None => (false, name),
        };
        let kind = CauseKind::parse(bare)
            .ok_or_else(|| TargetError::UnknownCause { name: bare.to_owned() })?;
        if negated {
            left_out.insert(kind)
        } else {
            sent.insert(kind)
        };
    }
    match (sent.is_empty(), left_out.is_empty()) {
        (false, true) => Ok(KindFilter::Only(sent)),
        (true, false) => Ok(KindFilter::Except(left_out)),
        (true, true) => Err(bad(format!("name at least one cause of {}", known_kinds()))),
        (false, false) => Err(bad(
            "name the causes to send (oom,hardware) or those to leave out (!preempted,!timeout), not both"
                .into(),
        )),
    }
}

fn parse_clusters(value: &str) -> Result<Vec<String>, TargetError> {
    let mut clusters = Vec::new();
    for cluster in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        trainstate_schema::validate_name("cluster", cluster).map_err(|e| {
            TargetError::BadValue {
                option: "cluster",
                value: cluster.to_owned(),
                rule: e.to_string(),
            }
        })?;
        clusters.push(cluster.to_owned());
    }
    if clusters.is_empty() {
        return Err(TargetError::BadValue {
            option: "cluster",
            value: value.to_owned(),
            rule: "name at least one cluster".into(),
        });
    }
    Ok(clusters)
}

fn parse_run_name(value: &str) -> Result<NamePattern, TargetError> {
    let bad = |rule: &str| TargetError::BadValue {
        option: "run_name",
        value: value.to_owned(),
        rule: rule.to_owned(),
    };
    if value.is_empty() {
        return Err(bad("give a name, or a pattern where * matches any text"));
    }
    if value.chars().count() > trainstate_schema::limits::MAX_NAME_LEN {
        return Err(bad("longer than a run name may be"));
    }
    Ok(NamePattern::new(value))
}

fn parse_target_name(value: &str) -> Result<String, TargetError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.:-".contains(c);
    if value.is_empty() || value.len() > MAX_TARGET_NAME_LEN || !value.chars().all(allowed) {
        return Err(TargetError::BadValue {
            option: "target",
            value: value.to_owned(),
            rule: format!("1 to {MAX_TARGET_NAME_LEN} of A-Z a-z 0-9 _ . : -"),
        });
    }
    Ok(value.to_owned())
}

fn parse_resend(kind: NotifyTargetKind, value: &str) -> Result<Duration, TargetError> {
    let bad =
        |rule: String| TargetError::BadValue { option: "resend", value: value.to_owned(), rule };
    if kind != NotifyTargetKind::Alertmanager {
        return Err(bad("only an Alertmanager target sends alerts again".into()));
    }
    let resend = humantime::parse_duration(value).map_err(|e| bad(e.to_string()))?;
    let (min, max) = RESEND_RANGE;
    if resend < min || resend > max {
        return Err(bad(format!("between {}s and {}s", min.as_secs(), max.as_secs())));
    }
    Ok(resend)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook(text: &str) -> Result<NotifyTarget, TargetError> {
        NotifyTarget::parse(NotifyTargetKind::Webhook, text)
    }

    #[test]
    fn options_ride_in_the_fragment_which_is_never_sent() {
        let target = webhook(
            "https://user:pw@hooks.example:8443/in?key=s3cret#events=errored,STALLED&cluster=a,b&run_name=bert-*&target=oncall",
        )
        .unwrap();
        assert_eq!(target.name(), "oncall");
        assert_eq!(target.url.as_str(), "https://user:pw@hooks.example:8443/in?key=s3cret");
        assert_eq!(
            target.events(),
            [NotifyEventKind::Errored, NotifyEventKind::Stalled, NotifyEventKind::Recovered]
        );
        assert_eq!(target.shown_url(), "https://hooks.example:8443/…");
        assert!(target.covers(Some("a"), "bert-large"));
        assert!(!target.covers(Some("c"), "bert-large"), "another cluster");
        assert!(!target.covers(None, "bert-large"), "no cluster");
        assert!(!target.covers(Some("b"), "gpt"), "another name");
    }

    #[test]
    fn defaults_name_the_host_and_send_what_needs_people() {
        let target = webhook("http://127.0.0.1:9000/hook").unwrap();
        assert_eq!(target.name(), "webhook-127.0.0.1:9000");
        assert!(target.covers(None, "anything"));
        assert!(!target.kinds.contains(&NotifyEventKind::Finished));
        assert!(target.kinds.contains(&NotifyEventKind::Recovered));
    }

    #[test]
    fn a_slack_url_is_shown_by_its_host_only_and_alertmanager_gets_its_path() {
        let slack = NotifyTarget::parse(
            NotifyTargetKind::Slack,
            "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
        )
        .unwrap();
        assert_eq!(slack.shown_url(), "https://hooks.slack.com:443/…");
        let am = NotifyTarget::parse(NotifyTargetKind::Alertmanager, "http://am:9093/#resend=5s")
            .unwrap();
        assert_eq!(am.url.as_str(), "http://am:9093/api/v2/alerts");
        assert_eq!(am.resend, Duration::from_secs(5));
        let given =
            NotifyTarget::parse(NotifyTargetKind::Alertmanager, "http://am:9093/api/v2/alerts")
                .unwrap();
        assert_eq!(given.url.as_str(), "http://am:9093/api/v2/alerts");
    }

    #[test]
    fn bad_targets_are_refused_naming_the_rule_never_the_secret() {
        let err = webhook("hooks.slack.com/services/T000/B000/XXXXXXXX").unwrap_err();
        assert!(matches!(err, TargetError::NotAUrl(_)), "{err}");
        assert!(!err.to_string().contains("XXXXXXXX"), "{err}");
        assert_eq!(webhook("ftp://host/x").unwrap_err(), TargetError::Scheme("ftp".into()));
        let err = webhook("http://h/#events=errored,explode").unwrap_err();
        assert_eq!(err, TargetError::UnknownEvent { name: "explode".into() });
        assert!(err.to_string().contains("known: errored, aborted, finished, stalled, restarting"));
        assert!(matches!(webhook("http://h/#colour=red"), Err(TargetError::UnknownOption { .. })));
        assert!(matches!(webhook("http://h/#events="), Err(TargetError::BadValue { .. })));
        assert!(matches!(webhook("http://h/#target=a b"), Err(TargetError::BadValue { .. })));
        assert!(matches!(webhook("http://h/#resend=5s"), Err(TargetError::BadValue { .. })));
        assert!(matches!(
            webhook("http://h/#events=errored&events=aborted"),
            Err(TargetError::RepeatedOption(_))
        ));
        assert!(matches!(
            NotifyTarget::parse(NotifyTargetKind::Alertmanager, "http://h/#resend=0s"),
            Err(TargetError::BadValue { option: "resend", .. })
        ));
    }

    fn fault(kind: CauseKind) -> Fault {
        Fault { class: Some(kind.class()), kind: Some(kind) }
    }

    const NO_CAUSE: Fault = Fault { class: None, kind: None };

    #[test]
    fn classes_send_only_failures_known_to_be_of_them() {
        let target = webhook("http://h/#classes=Application,NO_PROGRESS").unwrap();
        let filter = &target.causes;
        assert_eq!(
            filter.classes,
            Some(BTreeSet::from([CauseClass::Application, CauseClass::NoProgress]))
        );
        let errored = NotifyEventKind::Errored;
        assert!(filter.passes(errored, fault(CauseKind::UserError)));
        assert!(!filter.passes(errored, fault(CauseKind::Oom)), "the machine's fault");
        assert!(!filter.passes(NotifyEventKind::Restarting, fault(CauseKind::NodeLost)));
        assert!(!filter.passes(NotifyEventKind::Aborted, NO_CAUSE), "no cause: not known to be");
        assert!(filter.passes(NotifyEventKind::Stalled, Fault::STALL), "a stall is no_progress");
        let stalled_then_interrupted =
            Fault { class: Some(CauseClass::NoProgress), kind: Some(CauseKind::UserInterrupt) };
        assert!(filter.passes(NotifyEventKind::Aborted, stalled_then_interrupted));
        assert!(filter.passes(NotifyEventKind::Finished, NO_CAUSE), "a finish is no failure");
        let infra = webhook("http://h/#classes=infrastructure").unwrap();
        assert!(!infra.causes.passes(NotifyEventKind::Stalled, Fault::STALL));
    }

    #[test]
    fn causes_send_the_kinds_named_or_all_but_those_negated() {
        let only = webhook("http://h/#causes=oom,HARDWARE").unwrap().causes;
        assert_eq!(
            only.kinds,
            Some(KindFilter::Only(BTreeSet::from([CauseKind::Oom, CauseKind::Hardware])))
        );
        assert!(only.passes(NotifyEventKind::Errored, fault(CauseKind::Oom)));
        assert!(!only.passes(NotifyEventKind::Errored, fault(CauseKind::UserError)));
        assert!(!only.passes(NotifyEventKind::Stalled, Fault::STALL), "a stall has no kind");
        assert!(!only.passes(NotifyEventKind::Errored, NO_CAUSE));

        let except = webhook("http://h/#causes=!preempted,!Timeout").unwrap().causes;
        assert_eq!(
            except.kinds,
            Some(KindFilter::Except(BTreeSet::from([CauseKind::Preempted, CauseKind::Timeout])))
        );
        assert!(!except.passes(NotifyEventKind::Aborted, fault(CauseKind::Preempted)));
        assert!(!except.passes(NotifyEventKind::Restarting, fault(CauseKind::Timeout)));
        assert!(except.passes(NotifyEventKind::Aborted, fault(CauseKind::UserInterrupt)));
        assert!(except.passes(NotifyEventKind::Errored, NO_CAUSE), "not known to be preempted");
        assert!(except.passes(NotifyEventKind::Stalled, Fault::STALL));

        let both = webhook("http://h/#classes=infrastructure&causes=!node_lost").unwrap().causes;
        assert!(both.passes(NotifyEventKind::Errored, fault(CauseKind::Oom)));
        assert!(!both.passes(NotifyEventKind::Errored, fault(CauseKind::NodeLost)));
        assert!(!both.passes(NotifyEventKind::Errored, fault(CauseKind::UserError)));
        assert_eq!(webhook("http://h/").unwrap().causes, CauseFilter::default());
        assert!(CauseFilter::default().passes(NotifyEventKind::Errored, NO_CAUSE));
    }

    #[test]
    fn bad_classes_and_causes_are_refused_naming_the_option_the_value_and_the_words() {
        let err = webhook("http://h/#classes=application,user").unwrap_err();
        assert_eq!(err, TargetError::UnknownClass { name: "user".into() });
        assert_eq!(
            err.to_string(),
            "unknown class \"user\" in classes=; known: infrastructure, application, interrupted, no_progress"
        );
        let err = webhook("http://h/#causes=!preempted,!spot").unwrap_err();
        assert_eq!(err, TargetError::UnknownCause { name: "spot".into() });
        assert_eq!(
            err.to_string(),
            "unknown cause \"spot\" in causes=; known: user_error, system_error, lost_controller, \
             user_interrupt, oom, preempted, timeout, node_lost, hardware, no_progress"
        );
        let err = webhook("http://h/#causes=oom,!preempted").unwrap_err();
        assert!(matches!(err, TargetError::BadValue { option: "causes", .. }), "{err}");
        assert!(err.to_string().starts_with("causes=\"oom,!preempted\": name the causes to send"));
        let err = webhook("http://h/#classes=,").unwrap_err();
        assert!(matches!(err, TargetError::BadValue { option: "classes", .. }), "{err}");
        assert!(err.to_string().contains("no_progress"), "{err}");
        let err = webhook("http://h/#causes=!").unwrap_err();
        assert_eq!(err, TargetError::UnknownCause { name: String::new() });
        assert!(matches!(
            webhook("http://h/#causes=oom&causes=hardware"),
            Err(TargetError::RepeatedOption(_))
        ));
    }

    #[test]
    fn name_patterns_match_whole_names() {
        let p = |text: &str| NamePattern::new(text);
        assert!(p("bert").matches("bert"));
        assert!(!p("bert").matches("bert-large"));
        assert!(p("bert-*").matches("bert-large"));
        assert!(p("bert-*").matches("bert-"));
        assert!(!p("bert-*").matches("xbert-large"));
        assert!(p("*-large").matches("bert-large"));
        assert!(p("*ert*ar*").matches("bert-large"));
        assert!(!p("*ert*zz*").matches("bert-large"));
        assert!(p("a*a").matches("aa"));
        assert!(!p("a*a").matches("a"), "the prefix and suffix do not overlap");
        assert!(p("*").matches(""));
    }
}
