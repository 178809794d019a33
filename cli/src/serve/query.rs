//! Query strings as Spring reads `@RequestParam`s: `application/x-www-form-urlencoded`, the first value
//! of a repeated name, unknown names ignored.

use std::collections::HashMap;

/// The parameters of one query string.
#[derive(Debug, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    /// Parses a raw query string (`None`: no query).
    pub fn parse(raw: Option<&str>) -> Self {
        let mut params = HashMap::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            params.entry(decode(name)).or_insert_with(|| decode(value));
        }
        Self(params)
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// `application/x-www-form-urlencoded` decoding of one component (a `%` without two hex digits stays).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = &bytes[i + 1..i + 3];
                match std::str::from_utf8(hex)
                    .ok()
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_value_of_a_name_decoded() {
        let q = Query::parse(Some(
            "limit=2&cursor=1-0%2B&direction=FORWARD&limit=9&x=1&flag",
        ));
        assert_eq!(
            (q.get("limit"), q.get("cursor"), q.get("direction")),
            (Some("2"), Some("1-0+"), Some("FORWARD"))
        );
        assert_eq!(q.get("flag"), Some(""));
        assert_eq!(q.get("absent"), None);
        assert_eq!(Query::parse(None).get("limit"), None);
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%+1%é"), "% 1%é");
        assert_eq!(decode("%41%4a+b"), "AJ b");
    }
}
