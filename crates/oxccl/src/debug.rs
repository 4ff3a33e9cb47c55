//! Logging: `OXCCL_DEBUG` (else `NCCL_DEBUG`) installs a `tracing` subscriber
//! (once per process, and only if the application has not set its own).
//! At `INFO` and `TRACE` only the subsystems of `NCCL_DEBUG_SUBSYS` speak
//! ([`Subsystems`]): by default INIT, BOOTSTRAP and ENV, as NCCL; every
//! collective's algorithm, protocol and channels are COLL's.

use std::sync::Once;

use crate::config::{DebugLevel, Subsystems};

static INIT: Once = Once::new();

/// Installs a formatting subscriber at `level`, if one was requested.
/// `RUST_LOG` refines the filter when set.
pub(crate) fn init(level: Option<DebugLevel>, subsys: Subsystems) {
    let Some(level) = level else { return };
    INIT.call_once(|| {
        let directive = directive(level, subsys);
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(directive));
        // An application's own subscriber wins: failure here is expected then.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
        if level == DebugLevel::Version {
            eprintln!("oxccl version {}", env!("CARGO_PKG_VERSION"));
        }
    });
}

/// The filter of `level` over the subsystems `subsys`.
pub(crate) fn directive(level: DebugLevel, subsys: Subsystems) -> String {
    match level {
        DebugLevel::None => "off".into(),
        DebugLevel::Version | DebugLevel::Warn | DebugLevel::Abort => subsys.directives("warn"),
        DebugLevel::Info => subsys.directives("info"),
        DebugLevel::Trace => subsys.directives("trace"),
    }
}

/// A warning the user must see whether or not logging was asked for (a
/// wait for absent peers): through `tracing` where a subscriber takes
/// warnings, else straight to stderr, in NCCL's `WARN` manner.
pub(crate) fn warn_loud(rank: u32, msg: &str) {
    if tracing::enabled!(tracing::Level::WARN) {
        tracing::warn!(rank, "{msg}");
    } else {
        eprintln!("oxccl WARN rank {rank}: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    /// Which of a per-call line (COLL), an init line (INIT) and a network
    /// line (NET) a filter built for `subsys` at INFO lets through.
    fn shown(subsys: &str) -> (bool, bool, bool) {
        let s = Subsystems::parse("NCCL_DEBUG_SUBSYS", subsys).unwrap();
        let filter = tracing_subscriber::EnvFilter::new(directive(DebugLevel::Info, s));
        let sub = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(sub, || {
            (
                tracing::enabled!(target: "oxccl::coll", Level::INFO),
                tracing::enabled!(target: "oxccl::init", Level::INFO),
                tracing::enabled!(target: "oxccl_host::net", Level::INFO),
            )
        })
    }

    #[test]
    fn info_lines_show_only_for_their_subsystems() {
        assert_eq!(shown("INIT,BOOTSTRAP,ENV"), (false, true, false));
        assert_eq!(shown("COLL"), (true, false, false));
        assert_eq!(shown("ALL"), (true, true, true));
        assert_eq!(shown("^COLL"), (false, true, true));
        assert_eq!(shown("NET"), (false, false, true));
    }

    #[test]
    fn warnings_show_whatever_the_subsystems() {
        let s = Subsystems::parse("NCCL_DEBUG_SUBSYS", "COLL").unwrap();
        let filter = tracing_subscriber::EnvFilter::new(directive(DebugLevel::Info, s));
        let sub = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::sink)
            .finish();
        let (warn, info) = tracing::subscriber::with_default(sub, || {
            (
                tracing::enabled!(target: "oxccl::init", Level::WARN),
                tracing::enabled!(target: "oxccl::comm", Level::INFO),
            )
        });
        assert!(warn && !info);
    }
}
