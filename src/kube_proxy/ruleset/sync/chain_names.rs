//! The names of the chains one Service owns, kept in one allocation.
//!
//! The view holds every Service's chains for as long as the process runs: at 10,000 Services
//! of 10 endpoints, 110,000 names. As a `Vec<String>` each name costs its own allocation
//! (rounded up to the allocator's size class) plus 24 bytes of pointer, length and capacity;
//! joined in one string they cost their bytes and a separator.

/// Chain names in the order they were added, each at most once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainNames(Box<str>);

/// Between two names. Chain names are generated from Kubernetes names and addresses, which
/// never hold a newline; `push` refuses one rather than split a name in two.
const SEPARATOR: char = '\n';

impl ChainNames {
    /// From names in order. Panics on a name holding the separator or an empty name: neither
    /// can be generated, and either would come back as other names.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> ChainNames {
        let mut joined = String::new();
        for name in names {
            assert!(
                !name.is_empty() && !name.contains(SEPARATOR),
                "chain name {name:?} cannot be kept"
            );
            if !joined.is_empty() {
                joined.push(SEPARATOR);
            }
            joined.push_str(name);
        }
        ChainNames(joined.into_boxed_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.split(SEPARATOR).filter(|name| !name.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        if self.0.is_empty() {
            0
        } else {
            self.0.matches(SEPARATOR).count() + 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_in_order() {
        let names = [
            "service-ABC-ns/a/tcp/p",
            "endpoint-DEF-ns/a/tcp/p__10.0.0.1/80",
        ];
        let kept = ChainNames::new(names);
        assert_eq!(kept.iter().collect::<Vec<_>>(), names);
        assert_eq!(kept.len(), 2);
        assert!(!kept.is_empty());
    }

    #[test]
    fn no_names_is_empty() {
        let kept = ChainNames::new([]);
        assert_eq!(kept.iter().count(), 0);
        assert_eq!(kept.len(), 0);
        assert!(kept.is_empty());
        assert_eq!(kept, ChainNames::default());
    }

    #[test]
    #[should_panic(expected = "cannot be kept")]
    fn a_name_with_a_newline_is_refused() {
        ChainNames::new(["a\nb"]);
    }
}
