//! The house rules of the source tree (docs/architecture.md), checked on
//! every workspace crate's sources: no import circle between the modules of
//! one parent at any depth, no function over MAX_FN_LINES lines, no file
//! over MAX_FILE_LINES lines unless its first lines say why (a comment
//! containing "long file:"). Test code (`tests.rs`, `tests/`, `benches/`,
//! `#[cfg(test)]` modules) is held to the file rule only.
//!
//! Circles: each file is a module; a path it names (`crate::a::b`,
//! `super::x`, `self::y`, also inside `use` groups) is an edge to the
//! module the path reaches, lifted to the two children of the nearest
//! common parent. A child naming its parent's items is no edge (the parent
//! declares the child): circles between siblings are what make a crate's
//! floors unreadable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 120;
const MAX_FILE_LINES: usize = 600;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The workspace's crate folders, from its `members` (the root package's
/// sources are in spank-plugin/).
fn crate_dirs(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("workspace members");
    let list = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    let dirs: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .map(|m| if m == "." { "spank-plugin".to_string() } else { m })
        // The suites' package (tests/): held to the file rule below.
        .filter(|m| m != "tests")
        .collect();
    assert!(dirs.len() >= 8, "found only {dirs:?} in the workspace members");
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_test_file(rel: &Path) -> bool {
    rel.file_stem().is_some_and(|s| s == "tests") || rel.components().any(|c| c.as_os_str() == "tests")
}

/// A line with string and char literals blanked and its comment cut.
fn code_line(l: &str) -> String {
    // Char literals that hold a quote or a brace would read as code.
    let l = l.replace("'\"'", "''").replace("'{'", "''").replace("'}'", "''");
    let mut out = String::new();
    let (mut in_str, mut prev, mut chars) = (false, ' ', l.chars().peekable());
    while let Some(c) = chars.next() {
        if !in_str && c == '/' && chars.peek() == Some(&'/') {
            break;
        }
        if c == '"' && prev != '\\' {
            in_str = !in_str;
        } else if !in_str {
            out.push(c);
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    out
}

/// The code of a file, comments and literals blanked, with its
/// `#[cfg(test)]` modules left out (the code after one is kept).
fn code_of(text: &str) -> Vec<String> {
    let lines: Vec<String> = text.lines().map(code_line).collect();
    let mut out = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod ")) {
            // Skip the attribute and the module, to its closing brace.
            let (mut depth, mut started, mut j) = (0i64, false, i + 1);
            while j < lines.len() {
                for c in lines[j].chars() {
                    match c {
                        '{' => (depth, started) = (depth + 1, true),
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (started && depth <= 0) || (!started && lines[j].trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            out.extend(std::iter::repeat_n(String::new(), j + 1 - i));
            i = j + 1;
            continue;
        }
        out.push(lines[i].clone());
        i += 1;
    }
    out
}

/// The name of the function a line starts, if it starts one: attributes,
/// visibility (`pub(in ...)` too) and qualifiers before `fn`.
fn fn_name(line: &str) -> Option<String> {
    let mut t = line.trim_start();
    while let Some(rest) = t.strip_prefix("#[") {
        t = rest[rest.find(']')? + 1..].trim_start();
    }
    if let Some(rest) = t.strip_prefix("pub") {
        t = rest.trim_start();
        if let Some(rest) = t.strip_prefix('(') {
            t = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    loop {
        let before = t;
        for q in ["const ", "async ", "unsafe ", "extern \"C\" ", "extern ", "default "] {
            t = t.strip_prefix(q).unwrap_or(t).trim_start();
        }
        if t == before {
            break;
        }
    }
    let rest = t.strip_prefix("fn ")?;
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// Each `fn` of the code and how many lines it spans (brace matching).
fn function_lengths(code: &[String]) -> Vec<(usize, String, usize)> {
    let mut found = vec![];
    for (i, line) in code.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let (mut depth, mut started) = (0i64, false);
        for (j, l) in code.iter().enumerate().skip(i) {
            if !started && l.trim_end().ends_with(';') {
                break;
            }
            for c in l.chars() {
                match c {
                    '{' => (depth, started) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if started && depth <= 0 {
                found.push((i + 1, name.clone(), j - i + 1));
                break;
            }
        }
    }
    found
}

/// A module's path from its file: `a/b.rs` and `a/b/mod.rs` are `a::b`;
/// lib.rs and main.rs the crate root ("").
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    let keep = match parts.last().map(String::as_str) {
        Some("mod") => parts.len() - 1,
        Some("lib" | "main") if parts.len() == 1 => 0,
        _ => parts.len(),
    };
    parts[..keep].join("::")
}

fn parent_of(m: &str) -> String {
    m.rsplit_once("::").map_or(String::new(), |(p, _)| p.to_string())
}

fn join(base: &str, seg: &str) -> String {
    if base.is_empty() { seg.to_string() } else { format!("{base}::{seg}") }
}

/// The module a path reaches from `base`: its longest prefix that is a module.
fn reach(base: &str, segs: &[&str], modules: &BTreeSet<String>) -> String {
    let mut at = base.to_string();
    for s in segs {
        let next = join(&at, s);
        if !modules.contains(&next) {
            break;
        }
        at = next;
    }
    at
}

/// The paths a module's code names, each as (base module, segments).
fn named_paths(m: &str, code: &str) -> Vec<(String, Vec<String>)> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect::<String>();
    let mut out = vec![];
    for (key, base) in [("crate::", String::new()), ("super::", parent_of(m)), ("self::", m.to_string())] {
        for (i, _) in code.match_indices(key) {
            // `super::super::` and a `self::` inside a longer path are
            // rare here; a preceding identifier character means the key is
            // part of another path (`my_crate::`, handled by its own key).
            if code[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[i + key.len()..];
            let head = ident(rest);
            let mut segs: Vec<String> = head.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
            let after = &rest[head.len()..];
            if let Some(group) = after.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let item = ident(item.trim());
                    let mut s = segs.clone();
                    s.extend(item.split("::").filter(|s| !s.is_empty()).map(String::from));
                    out.push((base.clone(), s));
                }
                segs.clear();
            }
            if !segs.is_empty() {
                out.push((base.clone(), segs));
            }
        }
    }
    out
}

/// Edges between sibling modules: each reference lifted to the children of
/// the nearest common parent of the two modules.
fn module_graph(src: &Path, files: &[PathBuf]) -> BTreeMap<String, BTreeSet<String>> {
    let rels: Vec<&Path> = files.iter().map(|f| f.strip_prefix(src).unwrap()).collect();
    let modules: BTreeSet<String> = rels.iter().filter(|r| !r.starts_with("bin")).map(|r| module_of(r)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (f, rel) in files.iter().zip(&rels) {
        if rel.starts_with("bin") || is_test_file(rel) {
            continue;
        }
        let m = module_of(rel);
        let code = code_of(&std::fs::read_to_string(f).unwrap()).join("\n");
        for (base, segs) in named_paths(&m, &code) {
            let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
            let t = reach(&base, &segs, &modules);
            let (a, b): (Vec<&str>, Vec<&str>) = (m.split("::").collect(), t.split("::").collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            // One is the other's ancestor (or the same module): no edge.
            if m.is_empty() || t.is_empty() || common >= a.len().min(b.len()) {
                continue;
            }
            g.entry(a[..=common].join("::")).or_default().insert(b[..=common].join("::"));
        }
    }
    g
}

fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        u: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
        out: &mut Vec<Vec<String>>,
    ) {
        state.insert(u.to_string(), 1);
        path.push(u.to_string());
        for v in g.get(u).into_iter().flatten() {
            match state.get(v.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|p| p == v).unwrap();
                    out.push(path[from..].iter().cloned().chain([v.clone()]).collect());
                }
                None => visit(v, g, state, path, out),
                _ => {}
            }
        }
        path.pop();
        state.insert(u.to_string(), 2);
    }
    let (mut state, mut out) = (BTreeMap::new(), vec![]);
    for u in g.keys() {
        if !state.contains_key(u.as_str()) {
            visit(u, g, &mut state, &mut vec![], &mut out);
        }
    }
    out
}

fn unexplained_long_file(rel: &str, text: &str) -> Option<String> {
    let lines = text.lines().count();
    let explained = text.lines().take(8).any(|l| l.contains("long file:"));
    (lines > MAX_FILE_LINES && !explained)
        .then(|| format!("{rel}: {lines} lines, over {MAX_FILE_LINES} with no \"long file:\" reason at its top"))
}

#[test]
fn no_crate_has_an_import_circle_a_long_function_or_an_unexplained_long_file() {
    let root = root();
    let mut broken = vec![];
    for krate in crate_dirs(&root) {
        let src = root.join(&krate).join("src");
        let mut files = vec![];
        rust_files(&src, &mut files);
        assert!(!files.is_empty(), "no sources in {}", src.display());
        files.sort();
        for c in circles(&module_graph(&src, &files)) {
            broken.push(format!("{krate}: import circle {}", c.join(" -> ")));
        }
        for f in &files {
            let rel = f.strip_prefix(&root).unwrap().display().to_string();
            let text = std::fs::read_to_string(f).unwrap();
            broken.extend(unexplained_long_file(&rel, &text));
            if is_test_file(f.strip_prefix(&src).unwrap()) {
                continue;
            }
            for (at, name, n) in function_lengths(&code_of(&text)) {
                if n > MAX_FN_LINES {
                    broken.push(format!("{rel}:{at}: fn {name} is {n} lines, over {MAX_FN_LINES}"));
                }
            }
        }
        // Its tests and benchmarks: the file rule only.
        let mut others = vec![];
        rust_files(&root.join(&krate).join("tests"), &mut others);
        rust_files(&root.join(&krate).join("benches"), &mut others);
        for f in others {
            let rel = f.strip_prefix(&root).unwrap().display().to_string();
            broken.extend(unexplained_long_file(&rel, &std::fs::read_to_string(&f).unwrap()));
        }
    }
    // The real-Slurm suites and their helpers (the root package's tests).
    let mut suites = vec![];
    rust_files(&root.join("tests"), &mut suites);
    for f in suites {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        broken.extend(unexplained_long_file(&rel, &std::fs::read_to_string(&f).unwrap()));
    }
    assert!(broken.is_empty(), "the source tree breaks its rules:\n{}", broken.join("\n"));
}

#[test]
fn the_checks_see_what_they_are_for() {
    // A circle found in a graph.
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "a".into()]]);
    // A long function, with braces in strings and comments, an attribute
    // and `pub(in ...)` before it, and code after a test module.
    let body: Vec<String> =
        ["#[cfg(test)]", "mod tests {", "    fn t() {}", "}", "#[inline] pub(in crate::x) fn long() {"]
            .into_iter()
            .map(String::from)
            .chain((0..130).map(|i| format!("    let s{i} = \"}}\"; // {{")))
            .chain(["}".to_string()])
            .collect();
    assert_eq!(function_lengths(&code_of(&body.join("\n"))), vec![(5, "long".to_string(), 132)]);
    // Sibling modules naming each other through `super::` and `crate::`,
    // one level down, make a circle; a child naming its parent does not.
    let dir = std::env::temp_dir().join(format!("carma-layout-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("p")).unwrap();
    let files = [
        ("lib.rs", "mod p;"),
        ("p/mod.rs", "mod a; mod b; pub struct Shared; use a::A;"),
        ("p/a.rs", "use super::{b::B, Shared};"),
        ("p/b.rs", "use crate::p::a::A;"),
    ];
    let mut paths = vec![];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
        paths.push(src.join(name));
    }
    let found = circles(&module_graph(&src, &paths));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, vec![vec!["p::a".to_string(), "p::b".into(), "p::a".into()]]);
}
