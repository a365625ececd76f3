//! The benchmark tool's argument walk, `--key value` and `--key=value` alike, shared by its
//! two parts' parsers.

use anyhow::{anyhow, Result};

pub struct ArgWalk<'a> {
    rest: std::slice::Iter<'a, String>,
    key: String,
    inline: Option<String>,
}

impl<'a> ArgWalk<'a> {
    pub fn new(args: &'a [String]) -> ArgWalk<'a> {
        ArgWalk {
            rest: args.iter(),
            key: String::new(),
            inline: None,
        }
    }

    /// The next argument's key (`--key` of `--key=value`, or the whole argument).
    pub fn next_key(&mut self) -> Option<String> {
        let a = self.rest.next()?;
        (self.key, self.inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        Some(self.key.clone())
    }

    /// The current key's value: after `=`, else the next argument.
    pub fn value(&mut self) -> Result<String> {
        match self.inline.take() {
            Some(v) => Ok(v),
            None => self
                .rest
                .next()
                .cloned()
                .ok_or_else(|| anyhow!("{} needs a value", self.key)),
        }
    }
}
