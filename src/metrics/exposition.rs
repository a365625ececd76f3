//! The text exposition, spelled as Go's expfmt spells it.

use prometheus::{Encoder, Registry, TextEncoder};

/// The classic Prometheus text exposition of every family in `registry`, numbers spelled as
/// Go's expfmt spells them.
pub(crate) fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .expect("text encoding cannot fail");
    go_spelling(&String::from_utf8(out).expect("text exposition is UTF-8"))
}

/// The text exposition with numbers spelled as Go's expfmt spells them (`strconv` `'g'`):
/// `le="1e-06"` rather than `le="0.000001"`, and sample values likewise.
pub fn go_spelling(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for line in text.lines() {
        if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let series = match series.find("le=\"") {
            Some(at) => {
                let start = at + 4;
                match series[start..].find('"') {
                    Some(len) => match series[start..start + len].parse::<f64>() {
                        Ok(le) => format!(
                            "{}{}{}",
                            &series[..start],
                            crate::gofmt::go_float(le),
                            &series[start + len..]
                        ),
                        Err(_) => series.to_string(),
                    },
                    None => series.to_string(),
                }
            }
            None => series.to_string(),
        };
        out.push_str(&series);
        if !value.is_empty() {
            out.push(' ');
            match value.parse::<f64>() {
                Ok(v) => out.push_str(&crate::gofmt::go_float(v)),
                Err(_) => out.push_str(value),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spelling_rewrites_numbers_only() {
        let text = "# HELP x Some help 0.000001.\n# TYPE x counter\nx{a=\"le=\"} 23509451318\ny_bucket{le=\"0.000001\"} 3\nz NaN\n";
        assert_eq!(
            go_spelling(text),
            "# HELP x Some help 0.000001.\n# TYPE x counter\nx{a=\"le=\"} 2.3509451318e+10\ny_bucket{le=\"1e-06\"} 3\nz NaN\n"
        );
    }
}
