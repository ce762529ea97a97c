//! House rules checked like code: configuration is data (job files, flags, typed options), so
//! the libraries read no environment variable. Only the binaries do: the `quarry` crate (the model
//! runtime's `QUARRY_*` options through `ModelOptions::apply_vars`, Kafka credentials, the crash
//! tests' fault injection) and the benchmark binaries under `src/bin/`. Tests may.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, leaving out `bin/` folders (binaries).
fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                library_sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` that read the environment, outside comments.
fn env_reads(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            ["env::var(", "env::vars(", "env::var_os("]
                .iter()
                .any(|p| l.contains(p))
        })
        .map(|(i, l)| (i + 1, l.trim().to_owned()))
        .collect()
}

#[test]
fn the_libraries_read_no_environment_variable() {
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(root().join("workspace")).unwrap() {
        let dir = entry.unwrap().path();
        // The `quarry` crate is the binary: the one place the environment is read.
        if dir.file_name().is_some_and(|n| n == "quarry") || !dir.join("src").is_dir() {
            continue;
        }
        library_sources(&dir.join("src"), &mut sources);
    }
    assert!(
        sources.len() > 50,
        "found only {} library files",
        sources.len()
    );
    let mut found = Vec::new();
    for path in &sources {
        let text = std::fs::read_to_string(path).unwrap();
        for (line, code) in env_reads(&text) {
            found.push(format!("{}:{line}: {code}", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "libraries read the environment (pass it in from the binary as typed options):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_an_environment_read_where_there_is_one() {
    // The binary reads the model runtime's variables: the check above would see them there.
    let main = std::fs::read_to_string(root().join("workspace/quarry/src/main.rs")).unwrap();
    assert!(!env_reads(&main).is_empty());
    assert!(env_reads("    // std::env::var(\"X\") in a comment").is_empty());
    assert_eq!(
        env_reads("let a = 1;\nlet v = std::env::var_os(\"X\");").len(),
        1
    );
}

/// The `crate::` modules a source file of a crate names, outside its `#[cfg(test)]` modules and
/// comments: `crate::a::…` and each name of `crate::{a, b::…}`.
fn crate_imports(text: &str) -> std::collections::BTreeSet<String> {
    // Up to the first test-only module (`#[cfg(test)]` then `mod` or `pub(crate) mod`).
    let mut end = text.len();
    for (i, _) in text.match_indices("#[cfg(test)]\n") {
        let next = text[i..].lines().nth(1).unwrap_or("");
        if next.trim_start().contains("mod ") {
            end = i;
            break;
        }
    }
    let code = &text[..end];
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut out = std::collections::BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|part| ident(part.trim())));
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// A module path of `quarry-model` that leads back to where it started, if any.
fn import_loop(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            return Some(path[i..].iter().cloned().chain([at.to_owned()]).collect());
        }
        if !done.insert(at.to_owned()) {
            return None;
        }
        path.push(at.to_owned());
        for next in graph.get(at).into_iter().flatten() {
            if graph.contains_key(next) {
                if let Some(l) = visit(next, graph, path, done) {
                    return Some(l);
                }
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for start in graph.keys() {
        done.clear();
        if let Some(l) = visit(start, graph, &mut Vec::new(), &mut done) {
            return Some(l);
        }
    }
    None
}

#[test]
fn no_two_modules_of_the_model_crate_import_each_other() {
    let src = root().join("workspace/quarry-model/src");
    let mut files = Vec::new();
    library_sources(&src, &mut files);
    let mut graph = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = top.trim_end_matches(".rs").to_owned();
        if module == "lib" {
            continue;
        }
        let mut imports = crate_imports(&std::fs::read_to_string(path).unwrap());
        imports.remove(&module);
        graph.entry(module).or_default().extend(imports);
    }
    assert!(graph.len() > 15, "found {} modules", graph.len());
    assert_eq!(import_loop(&graph), None, "an import loop in quarry-model");
}

#[test]
fn the_loop_check_finds_a_loop_where_there_is_one() {
    let text = "use crate::a::X;\n// use crate::zz;\nuse crate::{b::Y, c};\n#[cfg(test)]\nfn f() { crate::e::g() }\n#[cfg(test)]\npub(crate) mod testing { use crate::d; }";
    let found: Vec<String> = crate_imports(text).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "e"]);
    let mut g = std::collections::BTreeMap::new();
    g.insert("a".to_string(), ["b".to_string()].into());
    g.insert("b".to_string(), ["c".to_string()].into());
    g.insert("c".to_string(), std::collections::BTreeSet::new());
    assert_eq!(import_loop(&g), None);
    g.get_mut("c").unwrap().insert("a".into());
    assert_eq!(import_loop(&g).unwrap().len(), 4);
}
