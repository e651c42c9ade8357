//! The broker socket the CLI talks to, and what to say when nobody answers there.

use std::path::PathBuf;

use gpushare::Monitor;

/// The control socket, and whether the user named it with `--socket`.
#[derive(Debug, Clone)]
pub struct BrokerSocket {
    pub path: PathBuf,
    /// Named with `--socket`: then the way out is not `GPUSHARE_SOCKET`, which the flag
    /// overrides.
    pub given: bool,
}

impl BrokerSocket {
    /// A monitor connection (no GPU session, no client id), or what went wrong as a sentence.
    pub fn monitor(&self) -> Result<Monitor, String> {
        Monitor::connect(&self.path).map_err(|e| self.describe(&e))
    }

    /// `e` as the user should read it.
    pub fn describe(&self, e: &gpushare::Error) -> String {
        match e {
            gpushare::Error::Connect { path, cause }
                if self.given && cause.kind() != std::io::ErrorKind::PermissionDenied =>
            {
                format!(
                    "cannot connect to gpushared at {}: {cause} — is gpushared running on that socket?",
                    path.display()
                )
            }
            other => other.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str) -> gpushare::Error {
        gpushare::Error::Connect {
            path: path.into(),
            cause: std::io::ErrorKind::NotFound.into(),
        }
    }

    #[test]
    fn the_environment_hint_is_given_only_when_socket_was_not() {
        let given = BrokerSocket {
            path: "/tmp/x.sock".into(),
            given: true,
        };
        let text = given.describe(&refused("/tmp/x.sock"));
        assert!(text.contains("/tmp/x.sock"), "{text}");
        assert!(text.contains("running on that socket"), "{text}");
        assert!(!text.contains("GPUSHARE_SOCKET"), "{text}");
        let default = BrokerSocket {
            given: false,
            ..given
        };
        assert!(
            default
                .describe(&refused("/tmp/x.sock"))
                .contains("GPUSHARE_SOCKET")
        );
    }
}
