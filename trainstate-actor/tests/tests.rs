//! Integration tests of the state actor: one binary, one module per concern.

mod common;
mod contract;
mod durability;
mod events;
mod forwarding;
mod hardening;
mod hardening_clocks;
mod hardening_events;
mod hardening_size;
mod hardening_store;
mod http_api;
mod http_bounds;
mod lifecycle;
mod listing;
mod liveness;
mod loading;
mod process;
mod ray_export;
mod ray_v2;
mod rendezvous;
mod shared_store;
mod singleton;
mod stores;
mod web;
mod write_path;
