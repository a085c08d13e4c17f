//! Property-style tests of the scheduler's bookkeeping over the scripted backend: random
//! arrivals, prompt lengths (long prefills beside short decodes), `max_tokens`, cancels,
//! hang-ups, page exhaustion (preemption and re-admission) and injected step failures. After
//! every step each job that ended got its own result and ended once; at the end every job has
//! ended and every page is back in the pool.

use std::collections::VecDeque;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use super::*;

/// A seeded generator, so a failing trial can be named by its seed.
struct Rng(ChaCha8Rng);

impl Rng {
    fn seeded(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `range` (inclusive).
    fn pick(&mut self, range: std::ops::RangeInclusive<usize>) -> usize {
        let span = (range.end() - range.start() + 1) as u64;
        range.start() + (self.next() % span) as usize
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A backend that fails chosen steps with a recoverable device error and runs the others.
struct Flaky {
    inner: ScriptedBackend,
    failing: Vec<usize>,
    steps: usize,
}

impl InferenceBackend for Flaky {
    const WORKER_TYPE: &'static str = "flaky";
    const MEMORY_ARCHITECTURE: &'static str = "cpu";

    fn info(&self) -> crate::backend::BackendInfo {
        self.inner.info()
    }

    fn kv_pages(&self) -> usize {
        self.inner.kv_pages()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn step(
        &mut self,
        chunks: &[Chunk<'_>],
        outputs: &mut StepOutputs,
    ) -> Result<(), BackendError> {
        self.steps += 1;
        if self.failing.contains(&(self.steps - 1)) {
            return Err(BackendError::Device("injected".to_owned()));
        }
        self.inner.step(chunks, outputs)
    }
}

/// One job of a trial.
struct Spec {
    /// The step before which it arrives.
    arrival: usize,
    prompt: Vec<u32>,
    max_tokens: usize,
    /// The step before which its client cancels it.
    cancel_at: Option<usize>,
    /// Its client hangs up after this many events.
    hang_up_after: Option<usize>,
}

/// The tokens the script gives `prompt` alone: what every job must get whatever runs beside it.
fn solo(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let script = script();
    let mut history = prompt.to_vec();
    for _ in 0..max_tokens {
        let next = script(&history);
        history.push(next);
    }
    history.split_off(prompt.len())
}

/// A prompt: mostly short chats, some long prompts that prefill over several steps, a third
/// starting with a shared system prompt.
fn random_prompt(rng: &mut Rng, system: &[u32]) -> Vec<u32> {
    let len = if rng.chance(20) {
        rng.pick(60..=300)
    } else {
        rng.pick(1..=24)
    };
    let salt = rng.pick(0..=1000) as u32;
    let mut prompt = if rng.chance(33) {
        system.to_vec()
    } else {
        Vec::new()
    };
    prompt.extend(super::prompt(len, salt));
    prompt
}

fn random_specs(rng: &mut Rng) -> Vec<Spec> {
    let system = super::prompt(rng.pick(16..=48), 77);
    let jobs = rng.pick(1..=12);
    let mut arrival = 0;
    (0..jobs)
        .map(|_| {
            arrival += rng.pick(0..=3);
            Spec {
                arrival,
                prompt: random_prompt(rng, &system),
                max_tokens: rng.pick(1..=16),
                cancel_at: rng.chance(15).then(|| arrival + rng.pick(0..=10)),
                hang_up_after: rng.chance(10).then(|| rng.pick(1..=6)),
            }
        })
        .collect()
}

fn random_config(rng: &mut Rng) -> SchedulerConfig {
    let max_running = rng.pick(1..=6);
    let prefill_chunk = [16, 32, 64, 256][rng.pick(0..=3)];
    SchedulerConfig {
        max_running,
        step_tokens: rng.pick(prefill_chunk + max_running..=prefill_chunk + 64),
        prefill_chunk,
        prefix_cache: rng.chance(50),
        paced_prefill: rng.chance(50),
        draft_max: [0, 0, 1, 4, 16][rng.pick(0..=4)],
    }
}

/// What a trial went through, so the test can show it covered each case.
#[derive(Default)]
struct Covered {
    preemptions: u64,
    cached_tokens: u64,
    cancelled: usize,
    failed: usize,
    /// Steps in which two or more jobs ended.
    ended_together: usize,
    /// Drafted tokens, and those the script agreed with.
    drafted: u64,
    accepted: u64,
}

/// Runs one trial; panics (naming the seed) when a job gets another's result, ends twice or
/// never, or a page is not returned.
fn trial(seed: u64, covered: &mut Covered) {
    let mut rng = Rng::seeded(seed);
    let specs = random_specs(&mut rng);
    let config = random_config(&mut rng);
    // Room for the longest job, and sometimes little more: decodes then preempt.
    let longest = specs
        .iter()
        .map(|s| pages_for(s.prompt.len() + s.max_tokens + 1))
        .max()
        .unwrap_or(1);
    let kv_pages = longest + rng.pick(0..=2 * longest);
    let failing = (0..400).filter(|_| rng.chance(3)).collect();
    let mut backend = Flaky {
        inner: ScriptedBackend::new(kv_pages, 10, script()),
        failing,
        steps: 0,
    };
    let tokenizer = tiny_tokenizer();
    let mut scheduler = Scheduler::new(config, kv_pages, 10);
    let cancels: Vec<CancelToken> = specs.iter().map(|_| CancelToken::new()).collect();
    let mut results: Vec<Option<Result<Finished, GenerateError>>> =
        specs.iter().map(|_| None).collect();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    let (mut arrived, mut admitted, mut ended) = (0, 0, 0);
    let context = format!("seed {seed}, {config:?}, {kv_pages} pages");
    for step in 0..10_000 {
        while arrived < specs.len() && specs[arrived].arrival <= step {
            waiting.push_back(arrived);
            arrived += 1;
        }
        for (name, spec) in specs.iter().enumerate() {
            if spec.cancel_at == Some(step) {
                cancels[name].cancel();
            }
        }
        while let Some(&name) = waiting.front() {
            let spec = &specs[name];
            if !scheduler.can_admit(spec.prompt.len()) {
                break;
            }
            let mut request = request(spec.prompt.clone(), spec.max_tokens);
            // Every other job greedy, so that it may speculate (the script's logits make
            // sampling at T = 1 pick the same tokens).
            if name % 2 == 0 {
                request.sampling.temperature = 0.0;
            }
            let seq = Sequence::new(request, cancels[name].clone()).unwrap();
            let job = Job {
                name,
                hang_up_after: spec.hang_up_after,
                ..Job::default()
            };
            scheduler.admit(job, seq);
            waiting.pop_front();
            admitted += 1;
        }
        let step_ended = scheduler.step(&mut backend, &tokenizer);
        covered.ended_together += usize::from(step_ended.len() > 1);
        for done in step_ended {
            let name = done.job.name;
            assert!(results[name].is_none(), "job {name} ended twice: {context}");
            check_result(&specs[name], &done, &context);
            match &done.result {
                Err(GenerateError::Cancelled) => covered.cancelled += 1,
                Err(_) => covered.failed += 1,
                Ok(_) => {}
            }
            results[name] = Some(done.result);
            ended += 1;
        }
        let stats = scheduler.stats();
        assert_eq!(
            stats.running + stats.preempted,
            admitted - ended,
            "jobs lost or duplicated after step {step}: {context}"
        );
        if arrived == specs.len() && waiting.is_empty() && scheduler.is_idle() {
            assert_eq!(
                stats.kv_pages_free, kv_pages,
                "pages not returned: {context}"
            );
            assert!(results.iter().all(Option::is_some), "{context}");
            covered.preemptions += stats.preemptions;
            covered.cached_tokens += stats.cached_tokens;
            covered.drafted += stats.drafted_tokens;
            covered.accepted += stats.accepted_tokens;
            return;
        }
    }
    panic!("the jobs did not finish: {context}");
}

/// A job's result is its own: its solo tokens when it finished; an error only for a cancel,
/// a hang-up or an injected failure.
fn check_result(spec: &Spec, done: &Ended<Job>, context: &str) {
    let name = done.job.name;
    match &done.result {
        Ok(finished) => assert_eq!(
            finished.tokens,
            solo(&spec.prompt, spec.max_tokens),
            "job {name} got another job's tokens: {context}"
        ),
        Err(GenerateError::Cancelled) => assert!(
            spec.cancel_at.is_some() || spec.hang_up_after.is_some(),
            "job {name} cancelled by nobody: {context}"
        ),
        Err(GenerateError::Backend(BackendError::Device(_))) => {}
        Err(other) => panic!("job {name}: {other:?}: {context}"),
    }
}

#[test]
fn random_traffic_gives_every_job_its_own_result_once_and_returns_every_page() {
    let mut covered = Covered::default();
    for seed in 0..2000 {
        trial(seed, &mut covered);
    }
    let Covered {
        preemptions,
        cached_tokens,
        cancelled,
        failed,
        ended_together,
        drafted,
        accepted,
    } = covered;
    eprintln!(
        "{preemptions} preemptions, {cached_tokens} cached tokens, {cancelled} cancelled, \
         {failed} failed, {ended_together} steps ending several jobs, {accepted} of {drafted} \
         drafts accepted"
    );
    assert!(preemptions > 0 && cached_tokens > 0 && cancelled > 0 && failed > 0);
    assert!(ended_together > 0 && accepted > 0 && accepted < drafted);
}

/// The case that panicked the engine: an old job still prefilling a long prompt while two
/// younger ones decode, all three ending in the same step (the plan lists decodes first). Swept
/// over the young jobs' `max_tokens` so that they end in every step of the long prefill.
#[test]
fn an_old_prefill_ending_beside_young_decodes_gives_each_job_its_own_tokens() {
    let tokenizer = tiny_tokenizer();
    for max_tokens in 1..=16 {
        let long = request(prompt(1000, 5), 1);
        let short = |salt| request(prompt(4, salt), max_tokens);
        let specs = [(long, 0), (short(1), 1), (short(2), 1)];
        // Room for the long prompt's chunk and both short prompts in one step.
        let config = SchedulerConfig {
            step_tokens: 72,
            prefill_chunk: 64,
            ..config(3)
        };
        let mut backend = ScriptedBackend::new(128, 10, script());
        let mut scheduler = Scheduler::new(config, 128, 10);
        let mut results: Vec<Option<Vec<u32>>> = vec![None; specs.len()];
        for step in 0..100 {
            for (name, (request, arrival)) in specs.iter().enumerate() {
                if *arrival == step {
                    let seq = Sequence::new(request.clone(), CancelToken::new()).unwrap();
                    let job = Job {
                        name,
                        ..Job::default()
                    };
                    scheduler.admit(job, seq);
                }
            }
            for done in scheduler.step(&mut backend, &tokenizer) {
                let name = done.job.name;
                assert!(results[name].is_none(), "job {name} ended twice");
                results[name] = Some(tokens(&done.result));
            }
        }
        for (name, (request, _)) in specs.iter().enumerate() {
            assert_eq!(
                results[name].as_deref(),
                Some(&solo(&request.prompt_tokens, request.max_tokens)[..]),
                "job {name}, young jobs' max_tokens {max_tokens}"
            );
        }
    }
}
