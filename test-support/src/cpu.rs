//! Client CPU for benchmarks: what decides a throughput ratio on a busy machine, measured beside it.

use std::time::Duration;

/// CPU time of this process's live threads: the sum of their `/proc/self/task/*/schedstat` run times
/// (Linux). Threads that ended between two readings are in neither, so a side measured with it must run
/// on threads that live through its phase (a tokio runtime's workers do). Zero where `/proc` is missing.
pub fn process_cpu() -> Duration {
    Duration::from_nanos(schedstat_sum(0))
}

/// How often this process's live threads were scheduled onto a CPU: the sum of their `schedstat`
/// time-slice counts (Linux; threads as in [`process_cpu`]). Each is a wake-up or a preemption, so its
/// growth per entry says how many thread hand-offs a consumer makes per entry, the cost that dominates
/// client CPU at low rates.
pub fn process_slices() -> u64 {
    schedstat_sum(2)
}

/// The sum over live threads of one `schedstat` field (0: run time in ns, 2: time slices).
fn schedstat_sum(field: usize) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut sum = 0u64;
    for task in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            sum += stat
                .split_whitespace()
                .nth(field)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
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

    #[test]
    fn a_thread_that_sleeps_is_scheduled_again_each_time() {
        let before = process_slices();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..20 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                // Read while this thread is still live: its slices count.
                assert!(process_slices() >= before + 20, "slices not counted");
            });
        });
    }
}
