//! No import circle among the state actor's modules: the top-level modules
//! of `trainstate-actor/src` (a file `x.rs` or a folder `x/`) import each
//! other one way only, so each can be read, and changed, on top of the ones
//! below it.
//!
//! The edges are read from the source: every path that starts with
//! `crate::` or climbs out of a module with `super::` (in `use` items and
//! in expressions alike, comments and strings aside), resolved to the
//! top-level module it names. A name the crate root re-exports
//! (`crate::StateService`) counts as the module it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An edge between two top-level modules, with where it was first seen.
type Edges = BTreeMap<(String, String), String>;

#[test]
fn no_import_circle_among_the_actor_modules() {
    let src = xtask::workspace_root().join("trainstate-actor/src");
    let edges = module_edges(&src);
    // The reader must see the imports it is meant to see, or the check
    // below would pass on nothing.
    for (from, to) in [("supervisor", "actor"), ("actor", "state"), ("writer", "store")] {
        assert!(
            edges.contains_key(&(from.to_owned(), to.to_owned())),
            "the import of {to} by {from} was not found; the reader is broken"
        );
    }
    let circles = circles(&edges);
    assert!(
        circles.is_empty(),
        "import circles among trainstate-actor's modules:\n{}",
        circles.join("\n")
    );
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

/// Every edge between two different top-level modules of the crate at `src`.
fn module_edges(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let root = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs reads");
    let modules: BTreeSet<String> =
        files.iter().filter_map(|file| module_path(src, file).first().cloned()).collect();
    let reexports = root_reexports(&tokens(&root), &modules);
    let mut edges = Edges::new();
    for file in &files {
        let path = module_path(src, file);
        let Some(from) = path.first() else { continue };
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for (line, target) in imports(&tokens(&text), &path) {
            let to = match target.as_str() {
                name if modules.contains(name) => name.to_owned(),
                name => match reexports.get(name) {
                    Some(module) => module.clone(),
                    None => continue,
                },
            };
            if &to != from {
                edges.entry((from.clone(), to)).or_insert_with(|| format!("{shown}:{line}"));
            }
        }
    }
    edges
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

/// The names the crate root re-exports (`pub use module::{A, B}`), each
/// with the top-level module it comes from.
fn root_reexports(
    tokens: &[(usize, Token)],
    modules: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].1 == Token::Ident("use".into())
            && let Some((_, Token::Ident(module))) = tokens.get(i + 1)
            && modules.contains(module)
        {
            let mut j = i + 2;
            while j < tokens.len() && tokens[j].1 != Token::Punct(';') {
                if let Token::Ident(name) = &tokens[j].1
                    && matches!(
                        tokens.get(j + 1).map(|t| &t.1),
                        Some(Token::Punct(',' | '}' | ';'))
                    )
                {
                    out.insert(name.clone(), module.clone());
                }
                j += 1;
            }
            i = j;
        }
        i += 1;
    }
    out
}

/// The first segment, below the crate root, of every path in `tokens` that
/// starts at the root (`crate::…`, or `super::` climbing to it), each with
/// its line. `module` is the file's module; inline modules (`mod tests {`)
/// are followed, so that their `super::` means the file's module.
fn imports(tokens: &[(usize, Token)], module: &[String]) -> Vec<(usize, String)> {
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
                // How far below the root the path starts.
                let mut depth = if word == "crate" { 0 } else { module.len() + inline.len() };
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
                // Still below the root: inside the file's own top module.
                let below_root = depth == 0;
                if below_root {
                    match tokens.get(j).map(|t| &t.1) {
                        Some(Token::Ident(name)) => out.push((*line, name.clone())),
                        Some(Token::Punct('{')) => {
                            out.extend(group_heads(tokens, j).into_iter().map(|n| (*line, n)))
                        }
                        _ => {}
                    }
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

/// The first segment of each item of the group `{a::X, b::{Y, Z}, c}` that
/// opens at `open`.
fn group_heads(tokens: &[(usize, Token)], open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (_, token) in &tokens[open..] {
        match token {
            Token::Punct('{') => {
                depth += 1;
                expect_head = depth == 1;
            }
            Token::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Token::Punct(',') if depth == 1 => expect_head = true,
            Token::Ident(name) if expect_head && depth == 1 => {
                heads.push(name.clone());
                expect_head = false;
            }
            _ => {}
        }
    }
    heads
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
