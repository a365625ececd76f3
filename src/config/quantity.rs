//! Kubernetes' `resource.Quantity` as a flag value (`quantity`, e.g.
//! `--log-text-info-buffer-size=2Ki`) and a config field (a string or a number).

use std::fmt;

/// A non-fractional amount with the spelling it was given in. Kubernetes rounds a fractional
/// quantity up when it is used as an integer (`Value()`); so does [`Quantity::value`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantity {
    text: String,
    value: i128,
}

/// resource.ParseQuantity's message for anything that is not a quantity.
const SYNTAX: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

impl Default for Quantity {
    fn default() -> Self {
        Quantity {
            text: "0".into(),
            value: 0,
        }
    }
}

impl Quantity {
    /// The amount, rounded up to an integer, saturating at i64's range.
    pub fn value(&self) -> i64 {
        self.value.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    pub fn parse(text: &str) -> Result<Quantity, String> {
        let syntax = || SYNTAX.to_string();
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(syntax());
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        // The amount as whole * 10^-digits, scaled by the suffix below.
        let digits = format!("{whole}{fraction}");
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| syntax())?
        };
        let mut ten_exp: i32 = -(fraction.len() as i32);
        let mut two_exp: u32 = 0;
        match suffix {
            "" => {}
            "Ki" => two_exp = 10,
            "Mi" => two_exp = 20,
            "Gi" => two_exp = 30,
            "Ti" => two_exp = 40,
            "Pi" => two_exp = 50,
            "Ei" => two_exp = 60,
            "n" => ten_exp -= 9,
            "u" => ten_exp -= 6,
            "m" => ten_exp -= 3,
            "k" => ten_exp += 3,
            "M" => ten_exp += 6,
            "G" => ten_exp += 9,
            "T" => ten_exp += 12,
            "P" => ten_exp += 15,
            "E" => ten_exp += 18,
            other => {
                let exp = other
                    .strip_prefix(['e', 'E'])
                    .filter(|e| !e.is_empty())
                    .ok_or_else(syntax)?;
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(syntax());
                }
                ten_exp += exp.parse::<i32>().map_err(|_| syntax())?;
            }
        }
        let too_big = || "quantity is too great".to_string();
        let mut value = mantissa.checked_mul(1i128 << two_exp).ok_or_else(too_big)?;
        if ten_exp >= 0 {
            let scale = 10i128.checked_pow(ten_exp as u32).ok_or_else(too_big)?;
            value = value.checked_mul(scale).ok_or_else(too_big)?;
        } else {
            let scale = 10i128
                .checked_pow(ten_exp.unsigned_abs())
                .unwrap_or(i128::MAX);
            // Rounded up, as Quantity.Value() does.
            value = (value + scale - 1) / scale;
        }
        Ok(Quantity {
            text: text.trim_start_matches('+').to_string(),
            value: if negative { -value } else { value },
        })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value == 0 {
            return f.write_str("0");
        }
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Quantity {
    type Err = String;

    fn from_str(text: &str) -> Result<Quantity, String> {
        Quantity::parse(text)
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// A string, or a plain number as YAML and JSON allow.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Form {
            Int(i64),
            Float(f64),
            Text(String),
        }
        let text = match Form::deserialize(deserializer)? {
            Form::Int(n) => n.to_string(),
            Form::Float(x) => x.to_string(),
            Form::Text(text) => text,
        };
        Quantity::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_kubernetes_suffixes() {
        for (text, value) in [
            ("0", 0),
            ("512", 512),
            ("1K", 0),
            ("1k", 1000),
            ("2Ki", 2048),
            ("3M", 3_000_000),
            ("5Mi", 5 << 20),
            ("1.5Ki", 1536),
            ("1e3", 1000),
            ("100m", 1),
            ("-1", -1),
        ] {
            if text == "1K" {
                assert!(Quantity::parse(text).is_err(), "K is not a suffix");
                continue;
            }
            assert_eq!(Quantity::parse(text).unwrap().value(), value, "{text}");
        }
        assert_eq!(Quantity::parse("abc").unwrap_err(), SYNTAX);
        assert_eq!(Quantity::parse("2Ki").unwrap().to_string(), "2Ki");
        assert_eq!(Quantity::default().to_string(), "0");
    }
}
