//! A rank's progress report: the rules `RankProgress::check` holds it to.

use trainstate_schema::api::RankProgress;

#[test]
fn a_step_time_is_finite_greater_than_zero_and_at_most_seven_days() {
    let with = |ms: f64| {
        let mut report = RankProgress::at_step(3);
        report.step_time_ms = Some(ms);
        report.check()
    };
    for ms in [0.001, 100.0, 604_800_000.0] {
        assert!(with(ms).is_ok(), "{ms}");
    }
    for ms in [0.0, -0.0, -1.0, 604_800_000.001, f64::NAN, f64::INFINITY] {
        let err = with(ms).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "progress.step_time_ms: must be a finite number greater than 0 and at most 604800000",
            "{ms}"
        );
    }
    let json: RankProgress = serde_json::from_str(r#"{"step": 4, "step_time_ms": 212.5}"#).unwrap();
    assert_eq!(json.step_time_ms, Some(212.5));
    assert!(json.check().is_ok());
}
