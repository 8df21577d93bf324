//! The house rules of the source tree (docs/architecture.md), checked on
//! every crate's sources: no import circle between a crate's modules, no
//! function over MAX_FN_LINES lines, no file over MAX_FILE_LINES lines
//! unless its first lines say why (a comment containing "long file:").
//! Test code (`tests.rs`, `tests/`, what follows `#[cfg(test)]`) is held
//! to the file rule only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 8] =
    ["config", "placement", "estimator", "simulator", "tools", "prolog", "spank-plugin", "nvml-standin"];
const MAX_FN_LINES: usize = 120;
const MAX_FILE_LINES: usize = 600;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
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

/// The code of a file without its comments and without its test module.
fn code_of(text: &str) -> Vec<String> {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines().map(|l| l.split("//").next().unwrap_or("").to_string()).collect()
}

/// Each `fn` and how many lines it spans (brace matching on code with
/// string and char literals blanked: rough, and enough for this rule).
fn function_lengths(code: &[String]) -> Vec<(usize, String, usize)> {
    let blank = |l: &str| {
        let mut out = String::new();
        let mut in_str = false;
        let mut prev = ' ';
        for c in l.chars() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.replace("'{'", "").replace("'}'", "")
    };
    let mut found = vec![];
    for (i, line) in code.iter().enumerate() {
        let t = line.trim_start();
        let Some(at) = t.find("fn ") else { continue };
        let head = &t[..at];
        let is_fn = head
            .split_whitespace()
            .all(|w| matches!(w, "pub" | "const" | "async" | "unsafe" | "extern" | "\"C\"") || w.starts_with("pub("));
        if !is_fn {
            continue;
        }
        let name: String = t[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let (mut depth, mut started) = (0i64, false);
        for (j, l) in code.iter().enumerate().skip(i) {
            let l = blank(l);
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

/// The crate's top-level modules each module's code names (`crate::x`).
fn module_graph(src: &Path, files: &[PathBuf]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
        let top = first.trim_end_matches(".rs").to_string();
        if matches!(top.as_str(), "lib" | "main" | "bin") || is_test_file(rel) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap()).join("\n");
        let mut named = |n: &str| {
            if n != top && n != "self" && n != "super" {
                g.entry(top.clone()).or_default().insert(n.to_string());
            }
        };
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + 7..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let n: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    named(&n);
                }
            } else {
                let n: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                named(&n);
            }
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
    for krate in CRATES {
        let src = root.join(krate).join("src");
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
    }
    // The real-Slurm suites and their helpers: the file rule only.
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
    // A circle, a long function and its length are found in made-up code.
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "a".into()]]);
    let body: Vec<String> = ["pub fn long() {".to_string()]
        .into_iter()
        .chain((0..130).map(|i| format!("    let s{i} = \"}}\"; // {{")))
        .chain(["}".to_string()])
        .collect();
    assert_eq!(function_lengths(&code_of(&body.join("\n"))), vec![(1, "long".to_string(), 132)]);
}
