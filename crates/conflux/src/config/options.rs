//! What a program sets per communicator when it makes one: HCCL's per-domain settings
//! (link, algorithm, timeout, traffic priority), as torch's `pg_options` and the Python
//! API's `Options` carry them. Unset fields keep the value the communicator would otherwise
//! get (the environment's for a new job, the parent's for a group).

use std::fmt::Write as _;
use std::time::Duration;

use super::{AlgoSpec, Config, TransportKind};
use crate::error::{Error, Result};

/// Per-communicator overrides of [`Config`]. Every rank of a new communicator must pass the
/// same options: `new_group_with` and `split_with` check it and fail naming the ranks that
/// differ, since ranks that disagree on the link or the algorithm could not talk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// The link kind every pair uses (HCCL's `set_transport`).
    pub transport: Option<TransportKind>,
    /// Algorithms forced, in `CONFLUX_ALGO`'s syntax once parsed.
    pub algo: Option<AlgoSpec>,
    /// Every blocking wait's deadline.
    pub timeout: Option<Duration>,
    /// DSCP code point (0-63) marked on every TCP data packet (see [`parse_traffic_class`]).
    pub traffic_class: Option<u8>,
}

impl Options {
    /// `config` with these options applied.
    pub fn apply(&self, config: &Config) -> Config {
        let mut c = config.clone();
        if let Some(t) = self.transport {
            c.transport = t;
        }
        if let Some(a) = self.algo {
            c.algo = a;
        }
        if let Some(t) = self.timeout {
            c.timeout = t;
        }
        if let Some(tc) = self.traffic_class {
            c.traffic_class = Some(tc);
        }
        c
    }

    /// Checks the values a caller built by hand.
    pub fn validate(&self) -> Result<()> {
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidArgument("options: timeout must be positive".into()));
        }
        if let Some(tc) = self.traffic_class.filter(|&tc| tc > 63) {
            return Err(Error::InvalidArgument(format!("options: traffic class {tc} is not a DSCP code point (0-63)")));
        }
        Ok(())
    }

    /// The options set, as every rank compares them when making a group: `""` for none.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if let Some(t) = self.transport {
            let _ = write!(s, ", transport={}", t.name());
        }
        if let Some(a) = self.algo {
            let _ = write!(s, ", algo={a:?}");
        }
        if let Some(t) = self.timeout {
            let _ = write!(s, ", timeout={}s", t.as_secs_f64());
        }
        if let Some(tc) = self.traffic_class {
            let _ = write!(s, ", traffic_class={tc}");
        }
        s
    }
}

/// A DSCP code point from a number (0-63) or its name: `cs0`-`cs7`, `af11`-`af43`, `ef`
/// (RFC 2474/2597/3246), case-insensitive.
pub fn parse_traffic_class(s: &str) -> Option<u8> {
    let s = s.trim().to_ascii_lowercase();
    if let Ok(n) = s.parse::<u8>() {
        return (n <= 63).then_some(n);
    }
    let digit = |c: u8, lo: u8, hi: u8| (lo..=hi).contains(&c.wrapping_sub(b'0')).then_some(c - b'0');
    match s.as_bytes() {
        b"ef" => Some(46),
        [b'c', b's', c] => digit(*c, 0, 7).map(|n| n * 8),
        [b'a', b'f', x, y] => Some(digit(*x, 1, 4)? * 8 + digit(*y, 1, 3)? * 2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_classes_parse_by_number_and_name() {
        assert_eq!(parse_traffic_class("46"), Some(46));
        assert_eq!(parse_traffic_class("EF"), Some(46));
        assert_eq!(parse_traffic_class("cs3"), Some(24));
        assert_eq!(parse_traffic_class("af41"), Some(34));
        assert_eq!(parse_traffic_class("af11"), Some(10));
        for bad in ["64", "af51", "af14", "cs8", "x", "", "-1"] {
            assert_eq!(parse_traffic_class(bad), None, "{bad}");
        }
    }

    #[test]
    fn options_apply_only_what_they_set() {
        let base = Config::default();
        let o = Options { transport: Some(TransportKind::Tcp), traffic_class: Some(10), ..Options::default() };
        let c = o.apply(&base);
        assert_eq!(c.transport, TransportKind::Tcp);
        assert_eq!(c.traffic_class, Some(10));
        assert_eq!(c.timeout, base.timeout);
        assert_eq!(o.describe(), ", transport=tcp, traffic_class=10");
        assert_eq!(Options::default().describe(), "");
        assert!(Options { timeout: Some(Duration::ZERO), ..Options::default() }.validate().is_err());
        assert!(Options { traffic_class: Some(64), ..Options::default() }.validate().is_err());
    }
}
