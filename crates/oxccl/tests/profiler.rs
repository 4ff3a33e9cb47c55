//! A profiler plugin of ours (v5 interface) hears a host run's launches.
//! One test per binary: a plugin is loaded once per process.

mod common;

#[test]
fn a_v5_plugin_hears_group_collective_and_p2p_events_in_order() {
    common::profiler::plugin_hears_launches_in_order(false);
}
