//! A tiny `--flag value` parser: the tools take few options, and every
//! error names the flag and says what is accepted.

use std::collections::HashMap;

#[derive(Debug)]
pub struct Args {
    values: HashMap<String, String>,
    switches: Vec<String>,
    pub positional: Vec<String>,
}

impl Args {
    /// `with_value` lists flags that take a value; `switches` those that don't.
    pub fn parse(
        argv: impl IntoIterator<Item = String>,
        with_value: &[&str],
        switches: &[&str],
    ) -> Result<Args, String> {
        let mut a = Args { values: HashMap::new(), switches: Vec::new(), positional: Vec::new() };
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            if let Some(flag) = arg.strip_prefix("--") {
                let (name, inline) = match flag.split_once('=') {
                    Some((n, v)) => (n.to_string(), Some(v.to_string())),
                    None => (flag.to_string(), None),
                };
                if with_value.contains(&name.as_str()) {
                    let v = inline.or_else(|| it.next()).ok_or_else(|| format!("--{name} needs a value"))?;
                    a.values.insert(name, v);
                } else if switches.contains(&name.as_str()) && inline.is_none() {
                    a.switches.push(name);
                } else {
                    let mut known: Vec<String> = with_value.iter().chain(switches).map(|f| format!("--{f}")).collect();
                    known.sort();
                    return Err(format!("unknown option --{name}; known: {}", known.join(" ")));
                }
            } else {
                a.positional.push(arg);
            }
        }
        Ok(a)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn has(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }

    /// Parses a value with `f`, naming the flag in the error.
    pub fn parsed<T>(&self, name: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
        self.get(name).map(|v| f(v).map_err(|e| format!("--{name}={v}: {e}"))).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Args, String> {
        Args::parse(v.iter().map(|s| s.to_string()), &["mem", "seconds"], &["json"])
    }

    #[test]
    fn parses_flags() {
        let a = p(&["--mem", "8G", "--seconds=3", "--json", "x"]).unwrap();
        assert_eq!(a.get("mem"), Some("8G"));
        assert_eq!(a.get("seconds"), Some("3"));
        assert!(a.has("json"));
        assert_eq!(a.positional, vec!["x"]);
        assert!(p(&["--mem"]).unwrap_err().contains("--mem needs a value"));
        assert!(p(&["--bogus"]).unwrap_err().contains("unknown option --bogus"));
        let e = a.parsed("seconds", |v| v.parse::<u8>().map_err(|_| "bad".to_string()));
        assert_eq!(e, Ok(Some(3)));
    }
}
