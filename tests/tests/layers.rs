//! The library's files import one another without circles (ARCHITECTURE.md: "dependencies point down
//! only"). A file's imports are its `crate::` and `super::` paths (also inside `use ...::{..}` lists),
//! resolved to the deepest module file that exists; unit tests are left out. A failure names the files of
//! each circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            if module.last().is_some_and(|m| m == "tests") {
                continue;
            }
            out.insert(module, path);
        }
    }
    out
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests { .. }`.
fn code(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &source[..at],
        None => source,
    };
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every `crate::a::b` / `super::a` path, with `{..}` lists expanded one level.
fn paths(code: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut offset = 0;
        while let Some(at) = code[offset..].find(start) {
            let before = code[..offset + at].chars().next_back();
            offset += at + start.len();
            let rest = &code[offset..];
            if before.is_some_and(|c| ident(c) || c == ':') {
                continue;
            }
            let mut segments = Vec::new();
            let mut tail = rest;
            loop {
                if let Some(list) = tail.strip_prefix('{') {
                    let end = list.find('}').unwrap_or(list.len());
                    for item in list[..end].split(',') {
                        let item = item.split(" as ").next().unwrap_or("").trim();
                        let mut path = segments.clone();
                        path.extend(
                            item.split("::")
                                .filter(|s| !s.is_empty() && *s != "self")
                                .map(str::to_owned),
                        );
                        out.push((start == "crate::", path));
                    }
                    segments.clear();
                    break;
                }
                let len = tail.find(|c: char| !ident(c)).unwrap_or(tail.len());
                if len == 0 {
                    break;
                }
                segments.push(tail[..len].to_owned());
                tail = &tail[len..];
                match tail.strip_prefix("::") {
                    Some(next) => tail = next,
                    None => break,
                }
            }
            if !segments.is_empty() {
                out.push((start == "crate::", segments));
            }
        }
    }
    out
}

fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules(root);
    let mut edges = BTreeMap::new();
    for (module, path) in &modules {
        let is_dir = path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        let code = code(&std::fs::read_to_string(path).unwrap());
        let mut targets = BTreeSet::new();
        for (from_crate, segments) in paths(&code) {
            let mut full: Module = if from_crate {
                Vec::new()
            } else if is_dir {
                module[..module.len().saturating_sub(1)].to_vec()
            } else {
                module[..module.len() - 1].to_vec()
            };
            let mut segments = segments.as_slice();
            while let Some(rest) = segments.strip_prefix(&["super".to_owned()]) {
                full.pop();
                segments = rest;
            }
            full.extend(segments.iter().cloned());
            while !full.is_empty() && !modules.contains_key(&full) {
                full.pop();
            }
            if !full.is_empty() && full != *module {
                targets.insert(full);
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// The strongly connected sets of more than one file (Tarjan).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a Module) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        for t in &w.edges[v] {
            if !w.index.contains_key(t) {
                visit(w, t);
                let low = w.low[t].min(w.low[v]);
                w.low.insert(v, low);
            } else if w.stack.contains(&t) {
                let low = w.index[t].min(w.low[v]);
                w.low.insert(v, low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut set = Vec::new();
            while let Some(t) = w.stack.pop() {
                set.push(t.clone());
                if t == v {
                    break;
                }
            }
            if set.len() > 1 {
                w.out.push(set);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.out
}

#[test]
fn the_library_has_no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stream-listener/src");
    let edges = graph(&root);
    assert!(edges.len() > 50, "read {} files", edges.len());
    let found = circles(&edges);
    assert!(found.is_empty(), "import circles: {found:?}");
}

#[test]
fn the_checker_finds_a_circle() {
    let dir = std::env::temp_dir().join(format!("sl-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "use crate::b::X;\nmod c;\n").unwrap();
    std::fs::write(dir.join("a/c.rs"), "use super::super::b;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::{a::c::Y, d};\n").unwrap();
    let found = circles(&graph(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let mut set: Vec<String> = found[0].iter().map(|m| m.join("/")).collect();
    set.sort();
    assert_eq!(set, ["a/c", "b"]);
}
