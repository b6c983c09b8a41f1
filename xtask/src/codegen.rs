//! The list of generated files and how to write or check them.

use std::path::{Path, PathBuf};

use schemars::Schema;
use trainstate_schema::openapi::to_document_text as pretty;

use crate::{contract, page, python, schema_doc};

/// One generated file: its path relative to the workspace root, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path relative to the workspace root, with `/` separators.
    pub path: String,
    /// The full text of the file.
    pub contents: String,
}

/// The root of the workspace (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// A named JSON Schema of one wire type.
pub(crate) struct NamedSchema {
    pub(crate) name: &'static str,
    pub(crate) schema: Schema,
}

/// The schemas of every public wire type, in documentation order.
pub(crate) fn wire_schemas() -> Vec<NamedSchema> {
    trainstate_schema::openapi::wire_schemas()
        .into_iter()
        .map(|(name, schema)| NamedSchema { name, schema })
        .collect()
}

/// Every generated file, computed in memory.
pub fn generated_files() -> Vec<GeneratedFile> {
    let schemas = wire_schemas();
    let mut files: Vec<GeneratedFile> = schemas
        .iter()
        .map(|named| GeneratedFile {
            path: format!("schemas/{}.schema.json", named.name),
            contents: pretty(named.schema.as_value()),
        })
        .collect();
    files.push(GeneratedFile {
        path: "schemas/openapi.json".into(),
        contents: pretty(&trainstate_schema::openapi::document()),
    });
    files.push(GeneratedFile {
        path: "docs/schema.md".into(),
        contents: schema_doc::render(&schemas),
    });
    files.push(GeneratedFile {
        path: python::TYPES_PATH.into(),
        contents: python::render_types(&schemas),
    });
    let contract = contract::contract(&schemas);
    files.push(GeneratedFile {
        path: python::CONTRACT_PATH.into(),
        contents: python::render_contract(&contract),
    });
    files.push(GeneratedFile { path: page::PATH.into(), contents: page::render(&contract) });
    files
}

/// Writes every generated file under `root`.
pub fn write(root: &Path) -> std::io::Result<()> {
    for file in generated_files() {
        let path = root.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, file.contents)?;
    }
    Ok(())
}

/// The generated files under `root` that are missing or differ from what
/// the generator produces now.
pub fn check(root: &Path) -> Vec<String> {
    generated_files()
        .into_iter()
        .filter(|file| {
            std::fs::read_to_string(root.join(&file.path)).ok().as_deref()
                != Some(file.contents.as_str())
        })
        .map(|file| file.path)
        .collect()
}
