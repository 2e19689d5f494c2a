//! The one error type of the core. Every variant names the argument it is about, so the
//! binding crate can map it to a Python exception whose message a user can act on.

use thiserror::Error;

/// What went wrong, and with which argument. `Value` maps to Python's `ValueError`,
/// `Index` to `IndexError` and `Type` to `TypeError`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// An argument has the right type but an invalid value (shape, range, structure).
    #[error("{arg}: {msg}")]
    Value { arg: &'static str, msg: String },
    /// An index argument points outside the object it indexes.
    #[error("{arg}: {msg}")]
    Index { arg: &'static str, msg: String },
    /// An argument has a type (dtype) the operation cannot take.
    #[error("{arg}: {msg}")]
    Type { arg: &'static str, msg: String },
}

impl Error {
    pub fn value(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Value {
            arg,
            msg: msg.into(),
        }
    }

    pub fn index(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Index {
            arg,
            msg: msg.into(),
        }
    }

    pub fn type_(arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Type {
            arg,
            msg: msg.into(),
        }
    }

    /// The argument the error is about.
    pub fn arg(&self) -> &'static str {
        match self {
            Error::Value { arg, .. } | Error::Index { arg, .. } | Error::Type { arg, .. } => arg,
        }
    }

    /// The error with argument `from` named `to`: for a caller whose own argument reaches
    /// a callee under another name (the trees a drafter batches are its caller's requests).
    pub fn renamed(self, from: &str, to: &'static str) -> Self {
        match self {
            Error::Value { arg, msg } if arg == from => Error::Value { arg: to, msg },
            Error::Index { arg, msg } if arg == from => Error::Index { arg: to, msg },
            Error::Type { arg, msg } if arg == from => Error::Type { arg: to, msg },
            other => other,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A float as a message shows it: plainly in the usual range, in exponent form far from it
/// (`Display` never uses an exponent: 1e300 would print as 301 digits).
pub fn show_f64(x: f64) -> String {
    let a = x.abs();
    if a.is_finite() && a != 0.0 && !(1e-4..1e16).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renamed_changes_only_the_named_argument() {
        let e = Error::index("trees", "too many").renamed("trees", "contexts");
        assert_eq!(e, Error::index("contexts", "too many"));
        assert_eq!(e.to_string(), "contexts: too many");
        let other = Error::value("budget", "x").renamed("trees", "contexts");
        assert_eq!(other, Error::value("budget", "x"));
        let t = Error::type_("trees", "y").renamed("trees", "request_ids");
        assert_eq!(t.arg(), "request_ids");
    }
}
