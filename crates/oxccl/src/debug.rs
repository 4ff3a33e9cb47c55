//! Logging: `OXCCL_DEBUG` (else `NCCL_DEBUG`) installs a `tracing` subscriber
//! (once per process, and only if the application has not set its own).
//! At `INFO` every collective logs its algorithm, protocol and channels.

use std::sync::Once;

use crate::config::DebugLevel;

static INIT: Once = Once::new();

/// Installs a formatting subscriber at `level`, if one was requested.
/// `RUST_LOG` refines the filter when set.
pub(crate) fn init(level: Option<DebugLevel>) {
    let Some(level) = level else { return };
    INIT.call_once(|| {
        let directive = match level {
            DebugLevel::None => "off",
            DebugLevel::Version | DebugLevel::Warn | DebugLevel::Abort => {
                "oxccl=warn,oxccl_host=warn,oxccl_cuda=warn"
            }
            DebugLevel::Info => "oxccl=info,oxccl_host=info,oxccl_cuda=info",
            DebugLevel::Trace => "oxccl=trace,oxccl_host=trace,oxccl_cuda=trace",
        };
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
