//! How much memory the one-step LL AllReduce's slots take (`oneshot_ll`),
//! computed alike wherever they are placed: allocated per rank thread, or
//! inside each rank process's link arena (`procs`).

/// Most bytes of LL slots a rank holds: 2 parities × ranks × lines × 16.
/// At 8 ranks it leaves the 64 KiB default whole (512 KiB fit); at 128
/// ranks it serves 32 KiB.
pub(super) const SLOT_BUDGET: u64 = 16 << 20;

/// LL lines per sender and parity a clique of `n` ranks gets for a payload
/// limit of `bytes` (0: the path is off).
pub(super) fn slot_lines(bytes: usize, n: usize) -> u64 {
    let asked = (bytes as u64).div_ceil(8);
    let fit = SLOT_BUDGET / (2 * n.max(1) as u64 * 16);
    asked.min(fit)
}

/// Bytes of one rank's slots.
pub(super) fn slot_bytes(n: usize, lines: u64) -> u64 {
    2 * n as u64 * lines * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_caps_the_lines_at_many_ranks() {
        // 8 ranks keep the 64 KiB default whole.
        assert_eq!(slot_lines(64 << 10, 8), 8192);
        assert_eq!(slot_bytes(8, 8192), 2 << 20);
        // 128 ranks serve 32 KiB, within the budget.
        assert_eq!(slot_lines(64 << 10, 128), 4096);
        assert_eq!(slot_bytes(128, 4096), SLOT_BUDGET);
        // A payload that is not whole lines rounds up; 0 is off.
        assert_eq!(slot_lines(9, 2), 2);
        assert_eq!(slot_lines(0, 8), 0);
        // A huge setting stops at the budget.
        assert!(slot_bytes(8, slot_lines(1 << 30, 8)) <= SLOT_BUDGET);
    }
}
