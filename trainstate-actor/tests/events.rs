//! `GET /api/train/events`: snapshot, deltas, and resume without gaps.

use std::time::Duration;

use reqwest::Client;
use serde_json::Value;
use trainstate_actor::http::HttpConfig;
use trainstate_client::StatusUpdate;
use trainstate_schema::RunId;

use crate::common::{Server, run_with};
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;

/// One Server-Sent Event.
#[derive(Debug)]
struct SseEvent {
    id: Option<String>,
    event: String,
    data: Value,
}

/// Reads events from a streaming response.
struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    async fn open(url: &str, last_event_id: Option<&str>) -> Self {
        let mut request = Client::new().get(url);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self { response, buffer: String::new() }
    }

    /// The next event (keep-alive comments skipped), within a deadline.
    async fn next(&mut self) -> SseEvent {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut event =
                        SseEvent { id: None, event: "message".into(), data: Value::Null };
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("id:") {
                            event.id = Some(v.trim().to_owned());
                        } else if let Some(v) = line.strip_prefix("event:") {
                            event.event = v.trim().to_owned();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        }
                    }
                    if data.is_empty() {
                        continue; // a keep-alive comment
                    }
                    event.data = serde_json::from_str(&data).unwrap();
                    crate::contract::check_event(&event.data);
                    return event;
                }
                let chunk = self.response.chunk().await.unwrap().expect("the stream goes on");
                self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("an event within 10 s")
    }
}

on_both_stores! {
    async fn a_reconnect_with_last_event_id_resumes_without_missing_an_event(store) {
        let fresh = store.fresh("a_reconnect_with_las").await;
        let server = Server::start(
            fresh.config().with_event_backlog(3),
            HttpConfig::default(),
        )
        .await;
        let state = server.service.handle();
        let events = format!("{}/api/train/events", server.url);
        let first = RunId::new_v7();
        state.register(run_with(&first, "first", "job", T0, 2)).await.unwrap();

        let mut stream = SseReader::open(&events, None).await;
        let snapshot = stream.next().await;
        assert_eq!(snapshot.event, "snapshot");
        assert_eq!(snapshot.data["train_runs"].as_array().unwrap().len(), 1);
        // Ids start at the head's epoch (see `view::epoch`): `s + 1` is the first.
        let s = snapshot.id.as_deref().unwrap().parse::<u64>().unwrap() - 1;
        let id = |n: u64| (s + n).to_string();

        state.set_status(first.clone(), StatusUpdate::finished()).await.unwrap();
        let change = stream.next().await;
        assert_eq!(change.event, "status_changed");
        assert_eq!(change.data["run"]["run_status"], "FINISHED");
        let last_seen = change.id.clone().unwrap();
        drop(stream);

        // Missed while disconnected.
        let missed: Vec<RunId> = (0..2).map(|_| RunId::new_v7()).collect();
        for (i, id) in missed.iter().enumerate() {
            state.register(run_with(id, &format!("missed{i}"), "job", T0 + 1, 2)).await.unwrap();
        }
        let mut stream = SseReader::open(&events, Some(&last_seen)).await;
        for id in &missed {
            let event = stream.next().await;
            assert_eq!(event.event, "registered", "no snapshot: the stream resumes");
            assert_eq!(event.data["run_id"], id.as_str());
        }
        let live = RunId::new_v7();
        state.register(run_with(&live, "live", "job", T0 + 2, 2)).await.unwrap();
        let event = stream.next().await;
        assert_eq!(
            (event.event.as_str(), &event.data["run_id"]),
            ("registered", &Value::from(live.as_str()))
        );
        assert_eq!(event.id, Some(id(5)));
        drop(stream);

        // Too far behind (the head keeps 3 events): a fresh snapshot instead.
        let mut stream = SseReader::open(&events, Some(&id(1))).await;
        let event = stream.next().await;
        assert_eq!(event.event, "snapshot");
        assert_eq!(event.data["train_runs"].as_array().unwrap().len(), 4);
        assert_eq!(event.id, Some(id(5)));
        drop(stream);
        server.stop().await;
    }

    async fn open_streams_end_at_shutdown_and_subscribers_are_bounded(store) {
        let fresh = store.fresh("open_streams_end_at_").await;
        let server = Server::start(
            fresh.config(),
            HttpConfig::default().with_max_subscribers(1),
        )
        .await;
        let events = format!("{}/api/train/events", server.url);
        let mut stream = SseReader::open(&events, None).await;
        assert_eq!(stream.next().await.event, "snapshot");
        let second = Client::new().get(&events).send().await.unwrap();
        assert_eq!(second.status(), 503);
        let body: Value = serde_json::from_str(&second.text().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "too_many_subscribers");
        // An open stream does not hold up a graceful shutdown.
        tokio::time::timeout(Duration::from_secs(10), server.stop())
            .await
            .expect("shutdown is not blocked");
        assert!(stream.response.chunk().await.map(|c| c.is_none()).unwrap_or(true));
    }
}
