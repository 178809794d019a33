//! Full and incremental sticky assignment at 100 x 500, 1,000 x 10,000 and 10,000 x 100,000
//! (members x shards). Full: every shard unowned. Incremental: one member joins a balanced group.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use stream_listener::coordinator::assignor::{assign, MemberSpec};

const SIZES: [(usize, u32); 3] = [(100, 500), (1_000, 10_000), (10_000, 100_000)];

fn fresh(members: usize) -> Vec<MemberSpec> {
    vec![
        MemberSpec {
            weight: 1,
            current: Vec::new()
        };
        members
    ]
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("assignor");
    group.sample_size(20);
    for (members, shards) in SIZES {
        let label = format!("{members}x{shards}");
        let empty = fresh(members);
        group.bench_with_input(BenchmarkId::new("full", &label), &empty, |b, specs| {
            b.iter(|| assign(black_box(shards), black_box(specs)))
        });
        let mut joined: Vec<MemberSpec> = assign(shards, &empty)
            .into_iter()
            .map(|current| MemberSpec { weight: 1, current })
            .collect();
        joined.push(MemberSpec {
            weight: 1,
            current: Vec::new(),
        });
        group.bench_with_input(BenchmarkId::new("one_join", &label), &joined, |b, specs| {
            b.iter(|| assign(black_box(shards), black_box(specs)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
