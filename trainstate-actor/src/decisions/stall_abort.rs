//! Ending a stalled run's ranks, when the run asked for it (its joins'
//! `on_stall: ABORT`): which ranks, from when, and the words their
//! watchers report (pure: the time is given).
//!
//! The actor decides an [`EndOrder`] from the run's health whenever the
//! health or its stall's capture may have changed, and publishes it on the
//! group's rank board ([`EndOrders`]); each rank's heartbeat answer then
//! carries `end_rank` once the order's time has come, on the connection's
//! fast path and the actor's alike. While no order is published, a
//! heartbeat pays one atomic read. The rules are in `docs/health.md`
//! ("Ending a stalled run").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use trainstate_schema::api::{CaptureState, DEFAULT_ABORT_AFTER_MS, StallAction};
use trainstate_schema::{HealthState, RunHealth, RunId, RunStatus};

use crate::decisions::time_text::iso_ms;

/// What a group's run asked the head to do when it stalls with ABORT: the
/// grace after the stall, and since when (wall ms) the group's attempt is
/// tracked, so that a stall written before it (of an earlier attempt)
/// ends none of its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AbortRule {
    /// How long after the stall its ranks are ended (ms).
    pub(crate) after_ms: u64,
    /// When the attempt the rule applies to was tracked (wall ms).
    pub(crate) attempt_from_ms: u64,
}

impl AbortRule {
    /// The rule of a group whose joins asked for `on_stall` and
    /// `abort_after_ms` (the first join that carried each), for an attempt
    /// tracked from `attempt_from_ms`: `None` unless it asked for ABORT.
    pub(crate) fn of(
        on_stall: Option<StallAction>,
        abort_after_ms: Option<u64>,
        attempt_from_ms: u64,
    ) -> Option<Self> {
        (on_stall == Some(StallAction::Abort)).then(|| Self {
            after_ms: abort_after_ms.unwrap_or(DEFAULT_ABORT_AFTER_MS),
            attempt_from_ms,
        })
    }
}

/// Which ranks of a stalled run are to be ended, from when, and what their
/// watchers are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndOrder {
    /// From when (wall ms, the head's clock): the stall's start plus the
    /// run's grace.
    pub(crate) from_ms: u64,
    /// The ranks to end, ascending; `None`: every rank.
    pub(crate) ranks: Option<Vec<u32>>,
    /// The words each rank's end reports.
    pub(crate) text: Arc<str>,
}

impl EndOrder {
    /// True when rank `rank` is one of the order's.
    fn names(&self, rank: u32) -> bool {
        self.ranks.as_ref().is_none_or(|ranks| ranks.binary_search(&rank).is_ok())
    }
}

/// The order of run `id` under `rule`, from its `health` while it is
/// `status`: present while the run is RUNNING and its health is a live
/// stall that began in the rule's attempt. The ranks to end are the
/// suspects of the stall's capture once it is complete, else the ranks the
/// stall names, else every rank.
pub(crate) fn end_order(
    id: &RunId,
    rule: AbortRule,
    status: RunStatus,
    health: Option<&RunHealth>,
) -> Option<EndOrder> {
    let health = health.filter(|h| h.state == HealthState::Stalled && h.ended_ms.is_none())?;
    if status != RunStatus::Running || health.since_ms < rule.attempt_from_ms {
        return None;
    }
    let complete = health.capture.as_ref().filter(|c| c.state == CaptureState::Complete);
    let suspects: Vec<u32> =
        complete.map(|c| c.suspects.iter().map(|s| s.rank).collect()).unwrap_or_default();
    let ranks = if !suspects.is_empty() {
        Some(suspects)
    } else if !health.ranks.is_empty() {
        Some(health.ranks.clone())
    } else {
        None
    };
    let ranks = ranks.map(|mut ranks| {
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    });
    Some(EndOrder {
        from_ms: health.since_ms.saturating_add(rule.after_ms),
        ranks,
        text: end_text(id, health).into(),
    })
}

/// The words a rank's end reports: since when the run made no progress,
/// why trainstate ended it, and where its stacks are.
fn end_text(id: &RunId, health: &RunHealth) -> String {
    let since = iso_ms(health.last_advance_ms.unwrap_or(health.since_ms));
    let stacks = match &health.capture {
        Some(capture) => {
            format!("its stacks: capture {}, GET /api/train/runs/{id}/stacks", capture.capture_id)
        }
        None => "no capture of its stacks was made".to_owned(),
    };
    format!(
        "the run made no progress since {since}; ended by trainstate because the run asked for on_stall ABORT; {stacks}"
    )
}

/// The end order published on a rank board: which of its ranks are to be
/// ended, and from when. Connections read it with each heartbeat's answer;
/// only the actor sets it.
pub(crate) struct EndOrders {
    /// The order's `from_ms`; `u64::MAX`: no order. What a heartbeat reads
    /// first, and usually only.
    from_ms: AtomicU64,
    order: RwLock<Option<Arc<EndOrder>>>,
}

impl Default for EndOrders {
    fn default() -> Self {
        Self { from_ms: AtomicU64::new(u64::MAX), order: RwLock::new(None) }
    }
}

impl EndOrders {
    /// Publishes `order` (`None`: no rank is to be ended), when it differs
    /// from the one published.
    pub(crate) fn set(&self, order: Option<EndOrder>) {
        let mut slot = self.order.write().unwrap_or_else(|e| e.into_inner());
        if slot.as_deref() == order.as_ref() {
            return;
        }
        let from_ms = order.as_ref().map_or(u64::MAX, |o| o.from_ms);
        // Closed before the order changes, opened after: a reader never
        // sees the new time with the old order.
        self.from_ms.store(u64::MAX, Ordering::Release);
        *slot = order.map(Arc::new);
        self.from_ms.store(from_ms, Ordering::Release);
    }

    /// The words rank `rank`'s heartbeat at `now_ms` (wall) carries, if the
    /// published order names it and its time has come.
    pub(crate) fn for_rank(&self, rank: u32, now_ms: u64) -> Option<String> {
        if now_ms < self.from_ms.load(Ordering::Acquire) {
            return None;
        }
        let order = self.order.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        (now_ms >= order.from_ms && order.names(rank)).then(|| order.text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use trainstate_schema::StallCapture;
    use trainstate_schema::api::StackSuspect;

    use super::*;

    const T0: u64 = 1_760_000_000_000;

    fn stalled(since_ms: u64, ranks: Vec<u32>) -> RunHealth {
        let mut health = RunHealth::new(HealthState::Stalled, since_ms, ranks, String::new());
        health.last_advance_ms = Some(since_ms - 10_000);
        health
    }

    fn rule() -> AbortRule {
        AbortRule { after_ms: 30_000, attempt_from_ms: T0 }
    }

    #[test]
    fn only_abort_makes_a_rule_and_the_grace_defaults() {
        assert_eq!(AbortRule::of(None, Some(5), T0), None);
        assert_eq!(AbortRule::of(Some(StallAction::Detect), Some(5), T0), None);
        let rule = AbortRule::of(Some(StallAction::Abort), None, T0).unwrap();
        assert_eq!(rule.after_ms, DEFAULT_ABORT_AFTER_MS);
    }

    #[test]
    fn the_complete_captures_suspects_come_first_then_the_stalls_ranks_then_all() {
        let id = RunId::new_v7();
        let mut health = stalled(T0 + 20_000, vec![3, 1]);
        let order = end_order(&id, rule(), RunStatus::Running, Some(&health)).unwrap();
        assert_eq!(order.ranks, Some(vec![1, 3]));
        assert_eq!(order.from_ms, T0 + 50_000);

        let suspect = StackSuspect::new(2, None, "f (x.py:1)".into());
        health.capture = Some(StallCapture::new(4, CaptureState::Pending, vec![suspect.clone()]));
        let order = end_order(&id, rule(), RunStatus::Running, Some(&health)).unwrap();
        assert_eq!(order.ranks, Some(vec![1, 3]), "a pending capture does not count");
        health.capture = Some(StallCapture::new(4, CaptureState::Complete, vec![suspect]));
        let order = end_order(&id, rule(), RunStatus::Running, Some(&health)).unwrap();
        assert_eq!(order.ranks, Some(vec![2]));
        assert!(order.text.contains(&format!("capture 4, GET /api/train/runs/{id}/stacks")));
        assert!(order.text.contains(&iso_ms(T0 + 10_000)), "{}", order.text);

        health.capture = Some(StallCapture::new(4, CaptureState::Complete, Vec::new()));
        health.ranks.clear();
        let order = end_order(&id, rule(), RunStatus::Running, Some(&health)).unwrap();
        assert_eq!(order.ranks, None, "every rank");
    }

    #[test]
    fn no_order_without_a_live_stall_of_this_attempt_on_a_running_run() {
        let id = RunId::new_v7();
        let health = stalled(T0 + 20_000, vec![1]);
        assert!(end_order(&id, rule(), RunStatus::Restarting, Some(&health)).is_none());
        let earlier = stalled(T0 - 1, vec![1]);
        assert!(end_order(&id, rule(), RunStatus::Running, Some(&earlier)).is_none());
        let mut ended = health.clone();
        ended.ended_ms = Some(T0 + 30_000);
        assert!(end_order(&id, rule(), RunStatus::Running, Some(&ended)).is_none());
        let progressing = RunHealth::new(HealthState::Progressing, T0 + 1, vec![], String::new());
        assert!(end_order(&id, rule(), RunStatus::Running, Some(&progressing)).is_none());
        assert!(end_order(&id, rule(), RunStatus::Running, None).is_none());
    }

    #[test]
    fn a_published_order_names_its_ranks_from_its_time_on() {
        let orders = EndOrders::default();
        assert_eq!(orders.for_rank(0, u64::MAX - 1), None);
        let order = EndOrder { from_ms: T0, ranks: Some(vec![2]), text: "end".into() };
        orders.set(Some(order));
        assert_eq!(orders.for_rank(2, T0 - 1), None);
        assert_eq!(orders.for_rank(2, T0).as_deref(), Some("end"));
        assert_eq!(orders.for_rank(0, T0), None);
        orders.set(None);
        assert_eq!(orders.for_rank(2, T0), None);
    }
}
