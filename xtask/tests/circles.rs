//! The head crate's structure, read from its source: four wings with the
//! arrows allowed between them, and no import circle among its files.
//!
//! The edges are read from the source: every path that starts with
//! `crate::` or climbs out of a module with `super::` (in `use` items and
//! in expressions alike, comments and strings aside), resolved to the
//! deepest file of the crate it names (`crate::engine::writer::Job` is
//! `engine/writer`). A name the crate root re-exports
//! (`crate::StateService`) counts as the file it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An edge between two files, named by their module paths
/// (`engine/writer`), with where it was first seen.
type Edges = BTreeMap<(String, String), String>;

/// The head crate's wings, from the bottom up, and the wings each may
/// import. The CLI (the binary's modules) and the crate root sit on top
/// and may import any wing.
const WINGS: [(&str, &[&str]); 4] = [
    ("decisions", &[]),
    ("store", &["decisions"]),
    ("engine", &["decisions", "store"]),
    ("services", &["engine", "decisions"]),
];

/// What services may import of the engine: its door, `StateService`, with
/// the configuration it is launched with, its errors and counters.
const ENGINE_DOOR: [&str; 4] =
    ["engine/supervisor", "engine/config", "engine/error", "engine/stats"];

/// What services may import of the decisions: leaves every wing shares
/// (clocks, the words of times, the throttle of repeated log lines).
const SHARED_DECISIONS: [&str; 3] =
    ["decisions/clock", "decisions/time_text", "decisions/log_throttle"];

fn head_src() -> PathBuf {
    xtask::workspace_root().join("trainstate-actor/src")
}

#[test]
fn no_import_circle_among_the_head_files() {
    let edges = file_edges(&head_src());
    // The reader must see the imports it is meant to see, or the check
    // below would pass on nothing.
    for (from, to) in [
        ("engine/supervisor", "engine/actor"),
        ("engine/actor", "decisions/state"),
        ("engine/writer", "store"),
        ("decisions/state/ray", "decisions/record"),
    ] {
        assert!(
            edges.contains_key(&(from.to_owned(), to.to_owned())),
            "the import of {to} by {from} was not found; the reader is broken"
        );
    }
    let circles = circles(&edges);
    assert!(
        circles.is_empty(),
        "import circles among trainstate-actor's files:\n{}",
        circles.join("\n")
    );
}

#[test]
fn every_head_file_keeps_to_its_wing() {
    let src = head_src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let path = module_path(&src, file);
        let on_top = path.is_empty() || path[0] == "cli";
        if !on_top && !WINGS.iter().any(|(wing, _)| *wing == path[0]) {
            broken.push(format!("{} is in no wing", path.join("/")));
        }
    }
    for ((from, to), site) in file_edges(&src) {
        if let Some(rule) = broken_arrow(&from, &to) {
            broken.push(format!("{from} -> {to} ({site}): {rule}"));
        }
    }
    assert!(broken.is_empty(), "arrows the wings do not allow:\n{}", broken.join("\n"));
}

#[test]
fn the_wing_rules_refuse_what_they_should() {
    assert_eq!(broken_arrow("engine/writer", "store/sqlite"), None);
    assert_eq!(broken_arrow("services/http/routes", "engine/supervisor"), None);
    assert_eq!(broken_arrow("cli/serve", "store/lock"), None);
    assert!(broken_arrow("store/sqlite", "engine/config").is_some());
    assert!(broken_arrow("decisions/rendezvous", "engine/view").is_some());
    assert!(broken_arrow("services/http/events", "engine/writer").is_some());
    assert!(broken_arrow("services/http/routes", "decisions/state").is_some());
    assert!(broken_arrow("services/forward", "store").is_some());
}

/// Why the arrow `from -> to` between two files breaks the wings' rules, if
/// it does.
fn broken_arrow(from: &str, to: &str) -> Option<String> {
    let wing = |path: &str| path.split('/').next().unwrap_or_default().to_owned();
    let (from_wing, to_wing) = (wing(from), wing(to));
    let Some((_, allowed)) = WINGS.iter().find(|(w, _)| *w == from_wing) else {
        return None; // the CLI and the crate root may import anything
    };
    if from_wing == to_wing {
        return None;
    }
    if !allowed.contains(&to_wing.as_str()) {
        return Some(format!("{from_wing} may import only {allowed:?}"));
    }
    let inside =
        |list: &[&str]| list.iter().any(|door| to == *door || to.starts_with(&format!("{door}/")));
    match (from_wing.as_str(), to_wing.as_str()) {
        ("services", "engine") if !inside(&ENGINE_DOOR) => {
            Some(format!("services reach the engine only through its door {ENGINE_DOOR:?}"))
        }
        ("services", "decisions") if !inside(&SHARED_DECISIONS) => {
            Some(format!("services take of the decisions only {SHARED_DECISIONS:?}"))
        }
        _ => None,
    }
}

#[test]
fn a_circle_is_found_and_named() {
    let mut edges = Edges::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        edges.insert((from.into(), to.into()), format!("{from}.rs:1"));
    }
    let circles = circles(&edges);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(circles[0].starts_with("a -> b -> c -> a"), "{}", circles[0]);
}

/// Every edge between two different files of the crate at `src`, each file
/// named by its module path.
fn file_edges(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> =
        files.iter().map(|file| module_path(src, file)).filter(|p| !p.is_empty()).collect();
    let root = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs reads");
    let reexports = root_reexports(&tokens(&root), &modules);
    let mut edges = Edges::new();
    for file in &files {
        let path = module_path(src, file);
        // The binary's modules (`main.rs`, `cli/`) are a crate of their own.
        if path.is_empty() || path[0] == "cli" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for (line, target) in imports(&tokens(&text), &path) {
            let to = match deepest_module(&target, &modules) {
                Some(module) => module,
                None => match target.first().and_then(|name| reexports.get(name)) {
                    Some(module) => module.clone(),
                    None => continue,
                },
            };
            if to != path {
                edges
                    .entry((path.join("/"), to.join("/")))
                    .or_insert_with(|| format!("{shown}:{line}"));
            }
        }
    }
    edges
}

/// The longest prefix of `path` that is a file's module.
fn deepest_module(path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|prefix| modules.contains(prefix))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("a source folder reads").map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is: `a/b.rs` and `a/b/mod.rs` are `[a, b]`; `lib.rs`
/// and `main.rs` are the root, `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> =
        relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && matches!(stem, "lib" | "main")) && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// A token of Rust source, with its line: an identifier or keyword, `::`,
/// or one punctuation character. Comments, strings and characters are
/// dropped.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(text: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if at(i + 1) == '/' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(chars[i] == '\n');
                        i += 1;
                    }
                }
            }
            'r' | 'b' if raw_string_start(&chars, i).is_some() => {
                let (hashes, body) = raw_string_start(&chars, i).unwrap();
                i = body;
                loop {
                    if i >= chars.len() {
                        break;
                    }
                    if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    line += usize::from(at(i) == '\n');
                    i += 1;
                }
                i += 1;
            }
            '\'' => {
                // A character ('x', '\n', '\u{..}') or a lifetime ('a).
                if at(i + 1) == '\\' {
                    i += 2;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            ':' if at(i + 1) == ':' => {
                out.push((line, Token::PathSep));
                i += 2;
            }
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // A byte string, `b"…"`, starts with a letter too.
                if let Some(end) = byte_string(&chars, start) {
                    line +=
                        chars[start..end.min(chars.len())].iter().filter(|&&c| c == '\n').count();
                    i = end;
                    continue;
                }
                out.push((line, Token::Ident(word)));
            }
            c => {
                out.push((line, Token::Punct(c)));
                i += 1;
            }
        }
    }
    out
}

/// If a raw string (`r"…"`, `r#"…"#`, `br"…"`) starts at `i`: its number of
/// hashes and where its body starts.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

/// If a byte string `b"…"` starts at `i` (raw ones are handled before):
/// where it ends.
fn byte_string(chars: &[char], i: usize) -> Option<usize> {
    if chars.get(i) == Some(&'b') && chars.get(i + 1) == Some(&'"') {
        let mut j = i + 2;
        while j < chars.len() && chars[j] != '"' {
            if chars[j] == '\\' {
                j += 1;
            }
            j += 1;
        }
        return Some(j + 1);
    }
    None
}

/// The names the crate root re-exports (`pub use a::b::{X, Y}`), each
/// with the file it comes from.
fn root_reexports(
    tokens: &[(usize, Token)],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (i, (_, token)) in tokens.iter().enumerate() {
        if *token != Token::Ident("use".into()) {
            continue;
        }
        for path in use_tree(tokens, i + 1) {
            if let (Some(name), Some(module)) = (path.last(), deepest_module(&path, modules)) {
                out.insert(name.clone(), module);
            }
        }
    }
    out
}

/// Every path, below the crate root, that `tokens` name from the root
/// (`crate::…`, or `super::` climbing), each with its line. `module` is the
/// file's module; inline modules (`mod tests {`) are followed, so that
/// their `super::` means the file's module.
fn imports(tokens: &[(usize, Token)], module: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    // The brace depths at which inline modules open.
    let mut inline: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let (line, token) = &tokens[i];
        match token {
            Token::Punct('{') => braces += 1,
            Token::Punct('}') => {
                braces = braces.saturating_sub(1);
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some((_, Token::Ident(_))), Some((_, Token::Punct('{')))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    inline.push(braces);
                }
            }
            Token::Ident(word)
                if (word == "crate" || word == "super")
                    && tokens.get(i + 1).map(|t| &t.1) == Some(&Token::PathSep)
                    && !matches!(
                        i.checked_sub(1).and_then(|p| tokens.get(p)).map(|t| &t.1),
                        Some(Token::PathSep)
                    ) =>
            {
                // How far below the root the path starts: inline modules
                // climb within the file's own module first.
                let mut depth = module.len() + inline.len();
                let mut j = i;
                while let Some((_, Token::Ident(w))) = tokens.get(j) {
                    if w == "crate" {
                        depth = 0;
                    } else if w == "super" {
                        depth = depth.saturating_sub(1);
                    } else {
                        break;
                    }
                    if tokens.get(j + 1).map(|t| &t.1) != Some(&Token::PathSep) {
                        break;
                    }
                    j += 2;
                }
                let base = &module[..depth.min(module.len())];
                for rest in use_tree(tokens, j) {
                    let mut path = base.to_vec();
                    path.extend(rest);
                    out.push((*line, path));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The paths of the use tree (or plain path) that starts at `at`:
/// `a::b::{c::D, e}` is `[a, b, c, D]` and `[a, b, e]`.
fn use_tree(tokens: &[(usize, Token)], at: usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut j = at;
    loop {
        match tokens.get(j).map(|t| &t.1) {
            Some(Token::Ident(name)) => {
                prefix.push(name.clone());
                if tokens.get(j + 1).map(|t| &t.1) != Some(&Token::PathSep) {
                    return vec![prefix];
                }
                j += 2;
            }
            Some(Token::Punct('{')) => {
                let mut out = Vec::new();
                let mut depth = 0;
                let mut item_start = true;
                for k in j..tokens.len() {
                    match &tokens[k].1 {
                        Token::Punct('{') => {
                            depth += 1;
                            item_start = depth == 1;
                            if depth == 1 {
                                continue;
                            }
                        }
                        Token::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Token::Punct(',') if depth == 1 => item_start = true,
                        _ => {}
                    }
                    if item_start && depth == 1 {
                        item_start = false;
                        for rest in use_tree(tokens, k) {
                            let mut path = prefix.clone();
                            path.extend(rest);
                            out.push(path);
                        }
                    }
                }
                return out;
            }
            _ => return if prefix.is_empty() { Vec::new() } else { vec![prefix] },
        }
    }
}

/// Every circle among `edges`: one per strongly connected group of modules
/// that import each other, named by one cycle through it, with where each
/// of its imports is.
fn circles(edges: &Edges) -> Vec<String> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    let nodes: Vec<&str> = next.keys().copied().collect();
    let reach = |from: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(node) = todo.pop() {
            for &n in &next[node] {
                if seen.insert(n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for &start in &nodes {
        if done.contains(start) || !reaches[start].contains(start) {
            continue;
        }
        let group: BTreeSet<&str> = nodes
            .iter()
            .copied()
            .filter(|n| reaches[start].contains(n) && reaches[n].contains(start))
            .collect();
        done.extend(&group);
        // A shortest cycle through `start`, within the group.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        'search: while let Some(node) = queue.pop_front() {
            for &n in &next[node] {
                if !group.contains(n) {
                    continue;
                }
                if n == start {
                    parent.insert(start, node);
                    break 'search;
                }
                if !parent.contains_key(n) {
                    parent.insert(n, node);
                    queue.push_back(n);
                }
            }
        }
        let mut cycle = vec![start];
        let mut node = parent[start];
        while node != start {
            cycle.push(node);
            node = parent[node];
        }
        cycle.push(start);
        cycle.reverse();
        let sites: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                format!("{} -> {} ({})", w[0], w[1], edges[&(w[0].to_owned(), w[1].to_owned())])
            })
            .collect();
        let others: Vec<&str> = group.iter().copied().filter(|n| !cycle.contains(n)).collect();
        out.push(format!(
            "{}: {}{}",
            cycle.join(" -> "),
            sites.join(", "),
            if others.is_empty() {
                String::new()
            } else {
                format!("; also in it: {}", others.join(", "))
            }
        ));
    }
    out
}
