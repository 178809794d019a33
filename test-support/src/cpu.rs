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

/// Other work on the machine, for a benchmark on a busy machine: processes that spin (`sh` in an endless
/// loop) until this is dropped. They are processes of their own, so their CPU time is not this
/// process's ([`process_cpu`]).
#[derive(Debug)]
pub struct BusyLoad(Vec<std::process::Child>);

impl BusyLoad {
    /// Starts `spinners` spinning processes (none for 0).
    pub fn start(spinners: u64) -> Self {
        Self(
            (0..spinners)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("start a spinning sh")
                })
                .collect(),
        )
    }

    /// The spinning processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(std::process::Child::id).collect()
    }
}

impl Drop for BusyLoad {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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

    #[test]
    fn busy_load_spins_in_other_processes_until_dropped() {
        let load = BusyLoad::start(1);
        let pid = load.pids()[0];
        let cpu_of = |pid: u32| -> Option<u64> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // utime and stime, in clock ticks: fields 14 and 15, after the parenthesised name.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            Some(fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while cpu_of(pid).unwrap_or(0) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the spinner used no CPU"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(load);
        // Killed and reaped: the process is gone.
        assert!(cpu_of(pid).is_none(), "the spinner outlived its BusyLoad");
    }
}
