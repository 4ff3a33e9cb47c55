//! A profiler plugin of ours with only the v4 interface is driven too.

mod common;

#[test]
fn a_v4_plugin_hears_group_collective_and_p2p_events_in_order() {
    common::profiler::plugin_hears_launches_in_order(true);
}
