//! `TrainRunStateManager`, used on a training run's controller.
//!
//! This crate will hold the manager that gathers every worker's metadata
//! through a `WorkerGroup`, registers the run once with the state actor, and
//! reports how the run ends, without ever blocking or breaking training. It
//! is a skeleton until the manager work lands.
