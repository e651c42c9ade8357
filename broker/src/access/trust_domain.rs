//! Trust domains: the groups of users who share one GPU context, and so each other's memory.

use std::fmt;

/// The name of a trust domain: 1–32 characters of `a-z`, `0-9`, `_` and `-`, starting with a
/// letter or digit (it names a worker process and shows in logs and metrics labels).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
// The policy file builds these directly from the names it checked at load.
pub struct TrustDomain(pub(super) String);

/// The naming rule, said in every refusal.
const RULE: &str = "a trust domain's name is 1 to 32 characters of a-z, 0-9, `_` and `-`, \
    starting with a letter or digit";

/// The longest name a trust domain may have.
const MAX_LEN: usize = 32;

/// Why a string is not a trust domain's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustDomainError {
    #[error("is empty; {rule}", rule = RULE)]
    Empty,
    #[error("`{name}` has {found:?}; {rule}", rule = RULE)]
    BadChar { name: String, found: char },
    #[error("`{0}` does not start with a letter or digit; {rule}", rule = RULE)]
    BadStart(String),
    #[error("`{0}` is longer than {max} characters; {rule}", max = MAX_LEN, rule = RULE)]
    TooLong(String),
}

impl TrustDomain {
    /// The domain of everyone the policy file puts in none.
    pub const DEFAULT: &'static str = "default";

    /// Checks `name` against the naming rule.
    pub fn new(name: &str) -> Result<TrustDomain, TrustDomainError> {
        let allowed =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
        let Some(first) = name.chars().next() else {
            return Err(TrustDomainError::Empty);
        };
        if let Some(found) = name.chars().find(|c| !allowed(*c)) {
            return Err(TrustDomainError::BadChar {
                name: name.to_string(),
                found,
            });
        }
        if first == '_' || first == '-' {
            return Err(TrustDomainError::BadStart(name.to_string()));
        }
        // All ASCII by now, so bytes are characters.
        if name.len() > MAX_LEN {
            return Err(TrustDomainError::TooLong(name.to_string()));
        }
        Ok(TrustDomain(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TrustDomain {
    fn default() -> Self {
        TrustDomain(TrustDomain::DEFAULT.to_string())
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
