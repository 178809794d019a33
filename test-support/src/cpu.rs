//! Client CPU for benchmarks: what decides a throughput ratio on a busy machine, measured beside it.

use std::time::Duration;

/// CPU time of this process's live threads: the sum of their `/proc/self/task/*/schedstat` run times
/// (Linux). Threads that ended between two readings are in neither, so a side measured with it must run
/// on threads that live through its phase (a tokio runtime's workers do). Zero where `/proc` is missing.
pub fn process_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut ns = 0u64;
    for task in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_shows_up_as_cpu_time() {
        let before = process_cpu();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        while process_cpu().saturating_sub(before) < Duration::from_millis(30) {
            assert!(std::time::Instant::now() < deadline, "no CPU time counted");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }
}
