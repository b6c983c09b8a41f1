//! The singleton: found by name, launched once, detached from callers.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use trainstate_actor::{StateConfig, get_or_launch_state_actor, shutdown_state_actor};
use trainstate_client::{DEFAULT_STATE_ACTOR_NAME, get_state_actor, get_state_actor_named};

use crate::common::{eventually, run, unique_name};

const T0: u64 = 1_760_000_000_000;

#[tokio::test]
async fn the_actor_is_found_by_its_well_known_name_and_never_launched_by_lookup() {
    assert!(get_state_actor().is_none(), "looking up launches nothing");
    let handle = get_or_launch_state_actor(StateConfig::in_memory()).await.unwrap();
    assert_eq!(handle.name(), DEFAULT_STATE_ACTOR_NAME);
    let found = get_state_actor().expect("found by the well-known name");
    let r = run("found", T0);
    found.register(r.clone()).await.unwrap();
    handle.get(r.id().clone()).await.unwrap();
    assert!(shutdown_state_actor(DEFAULT_STATE_ACTOR_NAME).await);
    assert!(get_state_actor().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_launchers_get_one_actor() {
    let name = unique_name("race");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let config = StateConfig::in_memory().with_name(name.clone());
            tokio::spawn(async move { get_or_launch_state_actor(config).await })
        })
        .collect();
    let mut handles = Vec::new();
    for task in tasks {
        handles.push(task.await.unwrap().unwrap());
    }
    // Each handle writes through to the same actor.
    for (i, handle) in handles.iter().enumerate() {
        handle.register(run(&format!("race{i}"), T0 + i as u64)).await.unwrap();
    }
    let total = handles[0].list(Default::default()).await.unwrap().total;
    assert_eq!(total, 100);
    shutdown_state_actor(&name).await;
}

/// A stand-in controller: an actor that asks the state actor to exist.
struct Controller;

enum ControllerMessage {
    Panic,
}

impl Actor for Controller {
    type Msg = ControllerMessage;
    type State = ();
    type Arguments = String;

    async fn pre_start(
        &self,
        _myself: ActorRef<ControllerMessage>,
        name: String,
    ) -> Result<(), ActorProcessingErr> {
        let state = get_or_launch_state_actor(StateConfig::in_memory().with_name(name))
            .await
            .map_err(|e| e.to_string())?;
        state.register(run("controller-run", T0)).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ControllerMessage>,
        message: ControllerMessage,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ControllerMessage::Panic => panic!("the controller crashes"),
        }
    }
}

#[tokio::test]
async fn the_actor_outlives_the_controller_that_launched_it() {
    let name = unique_name("detached");
    // A controller launches it and stops.
    let (controller, join) = Actor::spawn(None, Controller, name.clone()).await.unwrap();
    controller.stop(None);
    join.await.unwrap();
    let state = get_state_actor_named(&name).expect("still running after the controller stopped");
    assert_eq!(state.list(Default::default()).await.unwrap().total, 1);

    // Another controller panics.
    let (controller, join) = Actor::spawn(None, Controller, name.clone()).await.unwrap();
    controller.send_message(ControllerMessage::Panic).unwrap();
    join.await.unwrap();
    eventually("the controller to die", Duration::from_secs(5), || {
        std::future::ready(controller.get_status() == ractor::ActorStatus::Stopped)
    })
    .await;
    let state = get_state_actor_named(&name).expect("still running after the controller panicked");
    state.register(run("after-panic", T0 + 1)).await.unwrap();
    assert_eq!(state.list(Default::default()).await.unwrap().total, 3);
    shutdown_state_actor(&name).await;
}
