//! An error's report: what `fn main() -> Result<(), E>` prints when it returns one of the crate's
//! errors. Rust prints `Error: {:?}`, and a derived `Debug` shows the variant's structure
//! (`DuplicateMemberId { .. }`), never the `Display` text that says how to fix it. So the public error
//! types derive `ReportDebug` instead: `{:?}` is the text and its causes, as anyhow prints them, and
//! `{:#?}` keeps the structure.
//!
//! ```text
//! Error: Redis at redis://127.0.0.1:6390/: authentication failed ...
//!
//! Caused by:
//!     Password authentication failed - AuthenticationFailed
//! ```

use std::error::Error;
use std::fmt;

/// The texts of `error`'s causes (its `source` chain) that add something: a cause whose text the error's
/// own text, or an earlier cause's, already contains is left out (`redis: {0}` quotes its source, and
/// `#[error(transparent)]` repeats it).
pub(crate) fn causes(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut said = error.to_string();
    let mut causes = Vec::new();
    let mut next = error.source();
    // A source chain is finite, but nothing stops a type from returning itself: bound the walk.
    for _ in 0..32 {
        let Some(cause) = next else { break };
        let text = cause.to_string();
        if !text.is_empty() && !said.contains(&text) {
            said.push('\n');
            said.push_str(&text);
            causes.push(text);
        }
        next = cause.source();
    }
    causes
}

/// Writes `error`'s report: its text, then `Caused by:` and the causes that add something ([`causes`]),
/// one a line (numbered when more than one).
pub(crate) fn report(error: &(dyn Error + 'static), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{error}")?;
    let causes = causes(error);
    if causes.is_empty() {
        return Ok(());
    }
    f.write_str("\n\nCaused by:")?;
    for (i, cause) in causes.iter().enumerate() {
        if causes.len() == 1 {
            write!(f, "\n    {cause}")?;
        } else {
            write!(f, "\n    {i}: {cause}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a text and an optional cause.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    fn chain(texts: &[&'static str]) -> Layer {
        let mut layer = None;
        for text in texts.iter().rev() {
            layer = Some(Box::new(Layer(text, layer)));
        }
        *layer.unwrap()
    }

    struct Report<'a>(&'a Layer);

    impl fmt::Display for Report<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            report(self.0, f)
        }
    }

    #[test]
    fn an_error_without_causes_is_its_text() {
        assert_eq!(
            Report(&chain(&["no listener registered"])).to_string(),
            "no listener registered"
        );
    }

    #[test]
    fn causes_the_text_already_quotes_are_left_out() {
        let error = chain(&[
            "redis: connection refused",
            "connection refused",
            "connection refused",
        ]);
        assert!(causes(&error).is_empty());
        assert_eq!(Report(&error).to_string(), "redis: connection refused");
    }

    #[test]
    fn one_new_cause_is_printed_under_caused_by() {
        let error = chain(&[
            "Redis at redis://h/: authentication failed",
            "WRONGPASS invalid password",
        ]);
        assert_eq!(
            Report(&error).to_string(),
            "Redis at redis://h/: authentication failed\n\nCaused by:\n    WRONGPASS invalid password"
        );
    }

    #[test]
    fn the_crates_errors_debug_as_their_report_and_alternate_debug_as_their_structure() {
        let error = crate::RuntimeError::HooksForUnknownListener {
            name: "on_ordr".into(),
            known: vec!["on_order".into()],
        };
        assert_eq!(format!("{error:?}"), error.to_string());
        assert!(format!("{error:?}").starts_with("lifecycle hooks for `on_ordr`: no listener"));
        assert_eq!(
            format!("{error:#?}"),
            "HooksForUnknownListener {\n    name: \"on_ordr\",\n    known: [\n        \"on_order\",\n    ],\n}"
        );
        assert_eq!(
            format!("{:#?}", crate::RuntimeError::NoListeners),
            "NoListeners"
        );
        // A tuple variant, and a cause its text already quotes: no `Caused by:`.
        let redis =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let error = crate::RuntimeError::Store(crate::store::StoreError::Redis(redis));
        assert_eq!(format!("{error:?}"), "redis: connection refused");
        assert!(
            format!("{error:#?}").starts_with("Store(\n    Redis("),
            "{error:#?}"
        );
    }

    #[test]
    fn several_new_causes_are_numbered_in_order() {
        let error = chain(&[
            "start failed",
            "topology unreadable",
            "timed out",
            "timed out",
        ]);
        assert_eq!(
            Report(&error).to_string(),
            "start failed\n\nCaused by:\n    0: topology unreadable\n    1: timed out"
        );
    }
}
