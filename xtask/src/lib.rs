//! Code generation for trainstate: the committed JSON Schemas, schema docs,
//! the Python package's wire types and contract, and the web page's
//! contract.
//!
//! Every generated file is a pure function of the Rust types, so the same
//! generator writes the files (`cargo xtask codegen`), checks them
//! (`cargo xtask codegen --check`) and runs in-process in a test that fails
//! when a committed file is stale.

mod codegen;
mod contract;
mod page;
mod python;
mod schema_doc;

pub use codegen::{GeneratedFile, check, generated_files, workspace_root, write};
