//! The scheduler over the scripted backend: batching, admission, prefix reuse, preemption,
//! cancel, faults, and the per-job logic it steps (EOS, stop strings, `max_tokens`).

use std::sync::Arc;

use super::*;
use crate::generate::{CancelToken, GenerateEvent, GenerateRequest, StopReason};
use crate::sampling::SamplingParams;
use crate::testing::{ScriptedBackend, StepRecord, TINY_EOS, tiny_tokenizer};

mod properties;
mod speculation;

/// A job that keeps its events.
#[derive(Default)]
struct Job {
    name: usize,
    events: Vec<GenerateEvent>,
    hang_up_after: Option<usize>,
}

impl EventSink for Job {
    fn send(&mut self, event: GenerateEvent) -> bool {
        self.events.push(event);
        self.hang_up_after.is_none_or(|n| self.events.len() < n)
    }
}

/// Next token: 1..=9 from the history (never EOS), so sequences with other prompts differ.
fn script() -> crate::testing::Script {
    Arc::new(|history: &[u32]| {
        let sum: u64 = history.iter().map(|&t| u64::from(t)).sum();
        1 + (sum * 31 + history.len() as u64) as u32 % 9
    })
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens: prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        deadline: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 1 + (i * 7 + salt) % 9).collect()
}

fn config(max_running: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_running,
        step_tokens: 512,
        prefill_chunk: PREFILL_CHUNK,
        prefix_cache: true,
        paced_prefill: false,
        draft_max: 0,
    }
}

/// Runs every request to its end (admitting in order while there is room); returns each job's
/// result in request order, and the backend.
fn run_all(
    config: SchedulerConfig,
    backend: &mut ScriptedBackend,
    requests: Vec<GenerateRequest>,
) -> Vec<(Job, Result<Finished, GenerateError>)> {
    let tokenizer = tiny_tokenizer();
    let mut scheduler = Scheduler::new(config, backend.kv_pages(), backend.vocab_size());
    let mut waiting: VecDeque<_> = requests.into_iter().enumerate().collect();
    let mut results: Vec<Option<(Job, Result<Finished, GenerateError>)>> =
        (0..waiting.len()).map(|_| None).collect();
    for _ in 0..100_000 {
        while let Some((name, request)) = waiting.front() {
            if !scheduler.can_admit(request.prompt_tokens.len()) {
                break;
            }
            let seq = Sequence::new(request.clone(), CancelToken::new()).unwrap();
            let job = Job {
                name: *name,
                ..Job::default()
            };
            scheduler.admit(job, seq);
            waiting.pop_front();
        }
        for ended in scheduler.step(backend, &tokenizer) {
            let name = ended.job.name;
            results[name] = Some((ended.job, ended.result));
        }
        if waiting.is_empty() && scheduler.is_idle() {
            assert_eq!(scheduler.stats().kv_pages_free, backend.kv_pages());
            return results.into_iter().map(Option::unwrap).collect();
        }
    }
    panic!("the scheduler did not finish");
}

fn tokens(result: &Result<Finished, GenerateError>) -> Vec<u32> {
    result.as_ref().unwrap().tokens.clone()
}

/// The tokens each request gets when it runs alone.
fn each_alone(requests: &[GenerateRequest]) -> Vec<Vec<u32>> {
    requests
        .iter()
        .map(|r| {
            let mut backend = ScriptedBackend::new(64, 10, script());
            tokens(&run_all(config(1), &mut backend, vec![r.clone()])[0].1)
        })
        .collect()
}

#[test]
fn jobs_decode_together_and_each_gets_what_it_gets_alone() {
    let requests: Vec<_> = (0..4)
        .map(|i| request(prompt(5 + i * 9, i as u32), 20))
        .collect();
    let alone = each_alone(&requests);
    let mut backend = ScriptedBackend::new(64, 10, script());
    let steps = backend.steps();
    let together = run_all(config(4), &mut backend, requests);
    for (i, (_, result)) in together.iter().enumerate() {
        assert_eq!(tokens(result), alone[i], "job {i}");
        assert_eq!(result.as_ref().unwrap().stop_reason, StopReason::MaxTokens);
    }
    let steps = steps.lock().unwrap();
    assert_eq!(steps[0].chunks.len(), 4, "the four prompts in one step");
    for (k, step) in steps[1..20].iter().enumerate() {
        let decodes: Vec<_> = [5, 14, 23, 32].iter().map(|p| (p + k, 1)).collect();
        assert_eq!(step.chunks, decodes, "four decodes in step {}", k + 1);
    }
}

#[test]
fn long_prompts_are_cut_on_the_prefill_grid_and_decodes_go_first() {
    let mut backend = ScriptedBackend::new(128, 10, script());
    let steps = backend.steps();
    let requests = vec![request(prompt(3, 1), 4), request(prompt(600, 2), 2)];
    let config = SchedulerConfig {
        max_running: 2,
        step_tokens: 256,
        prefill_chunk: PREFILL_CHUNK,
        prefix_cache: false,
        paced_prefill: false,
        draft_max: 0,
    };
    run_all(config, &mut backend, requests);
    let steps = steps.lock().unwrap();
    let first = StepRecord {
        chunks: vec![(0, 3)],
    };
    assert_eq!(
        steps[0], first,
        "the second prompt's chunk does not fit beside the first"
    );
    // Decode first (one token), then the long prompt's grid chunk only if it fits the budget.
    let prefill: Vec<(usize, usize)> = steps
        .iter()
        .flat_map(|s| s.chunks.iter().copied())
        .filter(|&(_, len)| len > 3)
        .collect();
    assert_eq!(prefill, [(0, 256), (256, 256), (512, 88)]);
}

/// A long prompt beside two short ones on a backend whose steps take 2 ms and 1 ms a token,
/// paced (`paced = true`) or on the grid; returns the steps' chunks and each job's tokens
/// (checked against what it gets alone).
fn long_beside_short(paced: bool) -> Vec<Vec<(usize, usize)>> {
    let requests = vec![
        request(prompt(600, 2), 2),
        request(prompt(3, 1), 30),
        request(prompt(3, 3), 30),
    ];
    let alone = each_alone(&requests);
    let mut backend = ScriptedBackend::new(128, 10, script());
    backend.step_delay = Duration::from_millis(2);
    backend.token_delay = Duration::from_millis(1);
    let steps = backend.steps();
    let config = SchedulerConfig {
        paced_prefill: paced,
        prefix_cache: false,
        ..config(3)
    };
    let together = run_all(config, &mut backend, requests);
    for (i, (_, result)) in together.iter().enumerate() {
        assert_eq!(tokens(result), alone[i], "job {i}");
    }
    let steps = steps.lock().unwrap();
    steps.iter().map(|s| s.chunks.clone()).collect()
}

/// Paced: the short prompts are done in the first step (shortest first, the long prompt taking
/// the rest), and beside their decodes the long prompt advances a few tokens a step (a quarter
/// over a 4 ms decode step, at 1 ms a token), not a 256-token grid chunk. On the grid the second
/// step holds one. The bound is loose (32) because the pacer follows measured sleeps.
#[test]
fn paced_prompts_give_way_to_decodes_and_short_prompts() {
    // After the first step the long prompt's chunks start at 256 or later; the short jobs'
    // decodes at positions below 40.
    let prompt_tokens = |chunks: &[(usize, usize)]| -> usize {
        chunks
            .iter()
            .filter(|&&(p, _)| p >= 256)
            .map(|&(_, n)| n)
            .sum()
    };
    let paced = long_beside_short(true);
    assert_eq!(paced[0], [(0, 3), (0, 3), (0, 256)], "{paced:?}");
    let beside_decodes: Vec<usize> = paced[1..]
        .iter()
        .filter(|chunks| chunks.iter().any(|&(p, n)| n == 1 && p < 40))
        .map(|chunks| prompt_tokens(chunks))
        .filter(|&n| n > 0)
        .collect();
    assert!(
        beside_decodes.iter().all(|&n| n < 32) && beside_decodes.len() >= 5,
        "prompt tokens beside decodes, step by step: {beside_decodes:?}"
    );
    let grid = long_beside_short(false);
    assert_eq!(prompt_tokens(&grid[1]), 256, "{grid:?}");
}

#[test]
fn the_grid_is_the_backends() {
    let mut backend = ScriptedBackend::new(128, 10, script());
    let steps = backend.steps();
    let config = SchedulerConfig {
        prefill_chunk: 100,
        step_tokens: 64,
        ..config(1)
    };
    run_all(config, &mut backend, vec![request(prompt(250, 2), 2)]);
    let chunks: Vec<(usize, usize)> = steps
        .lock()
        .unwrap()
        .iter()
        .flat_map(|s| s.chunks.iter().copied())
        .collect();
    // The step budget grows to hold one grid chunk.
    assert_eq!(chunks[..3], [(0, 100), (100, 100), (200, 50)]);
}

#[test]
fn a_grid_chunk_as_large_as_the_budget_still_runs_beside_decodes() {
    let mut backend = ScriptedBackend::new(128, 10, script());
    let steps = backend.steps();
    let requests = vec![
        request(prompt(3, 1), 40),
        request(prompt(3, 2), 40),
        request(prompt(600, 3), 2),
    ];
    let config = SchedulerConfig {
        prefill_chunk: 512,
        step_tokens: 512,
        prefix_cache: false,
        ..config(3)
    };
    run_all(config, &mut backend, requests);
    let steps = steps.lock().unwrap();
    let with_chunk = steps
        .iter()
        .position(|s| s.chunks.contains(&(0, 512)))
        .expect("the long prompt's first chunk ran");
    let decodes = steps[with_chunk]
        .chunks
        .iter()
        .filter(|&&(_, len)| len == 1)
        .count();
    // It did not wait for the short jobs to end: the budget holds a grid chunk and every decode.
    assert_eq!(decodes, 2, "step {with_chunk}: {:?}", steps[with_chunk]);
}

#[test]
fn a_shared_prefix_skips_its_prefill_and_changes_nothing() {
    let shared = prompt(40, 3);
    let mut second = shared.clone();
    second.extend([1, 2, 3]);
    let requests = vec![request(shared.clone(), 5), request(second.clone(), 5)];
    let mut backend = ScriptedBackend::new(64, 10, script());
    let with_cache = run_all(config(1), &mut backend, requests.clone());
    let second_result = with_cache[1].1.as_ref().unwrap();
    assert_eq!(
        second_result.cached_tokens, 32,
        "two full pages of the shared 40"
    );
    let mut backend = ScriptedBackend::new(64, 10, script());
    let no_cache = SchedulerConfig {
        prefix_cache: false,
        ..config(1)
    };
    let without = run_all(no_cache, &mut backend, requests);
    assert_eq!(without[1].1.as_ref().unwrap().cached_tokens, 0);
    for i in 0..2 {
        assert_eq!(tokens(&with_cache[i].1), tokens(&without[i].1));
    }
}

/// Twelve jobs on a pool of 14 pages, eight at a time, so that they preempt each other; checks
/// that each ends once with the tokens it gives alone, no gap and no repeat. Returns the
/// prompt lengths and the chunks (first position, tokens) of every step.
fn exhaust_the_pool() -> (Vec<usize>, Vec<(usize, usize)>) {
    let requests: Vec<_> = (0..12)
        .map(|i| request(prompt(30 + i * 5, i as u32), 40))
        .collect();
    let prompts = requests.iter().map(|r| r.prompt_tokens.len()).collect();
    let alone = each_alone(&requests);
    // 14 pages of 16: one sequence needs up to 8, so eight running at once must preempt.
    let mut backend = ScriptedBackend::new(14, 10, script());
    let steps = backend.steps();
    let tokenizer = tiny_tokenizer();
    let mut scheduler = Scheduler::new(
        SchedulerConfig {
            prefix_cache: false,
            ..config(8)
        },
        14,
        10,
    );
    let mut ended = Vec::new();
    let mut waiting: VecDeque<_> = requests.into_iter().enumerate().collect();
    while ended.len() < 12 {
        while let Some((name, r)) = waiting.front() {
            if !scheduler.can_admit(r.prompt_tokens.len()) {
                break;
            }
            let job = Job {
                name: *name,
                ..Job::default()
            };
            scheduler.admit(job, Sequence::new(r.clone(), CancelToken::new()).unwrap());
            waiting.pop_front();
        }
        ended.extend(scheduler.step(&mut backend, &tokenizer));
    }
    assert!(scheduler.stats().preemptions > 0);
    assert_eq!(scheduler.stats().kv_pages_free, 14);
    for e in &ended {
        assert_eq!(tokens(&e.result), alone[e.job.name], "job {}", e.job.name);
        let indices: Vec<usize> = e
            .job
            .events
            .iter()
            .filter_map(|ev| match ev {
                GenerateEvent::Token { index, .. } => Some(*index),
                GenerateEvent::Metrics { .. } => None,
            })
            .collect();
        assert_eq!(
            indices,
            (0..indices.len()).collect::<Vec<_>>(),
            "no gap, no repeat"
        );
    }
    let chunks = steps
        .lock()
        .unwrap()
        .iter()
        .flat_map(|s| s.chunks.clone())
        .collect();
    (prompts, chunks)
}

/// Whether every chunk of more than one token ends on the prefill grid or at a prompt's end:
/// the only places a first run cuts a prompt.
fn chunks_end_where_a_first_run_cuts(prompts: &[usize], chunks: &[(usize, usize)]) -> bool {
    chunks.iter().all(|&(start, len)| {
        let end = start + len;
        len == 1 || end % PREFILL_CHUNK == 0 || prompts.contains(&end)
    })
}

#[test]
fn page_exhaustion_preempts_and_every_job_still_ends_once_with_its_tokens() {
    let (prompts, chunks) = exhaust_the_pool();
    assert!(
        !chunks_end_where_a_first_run_cuts(&prompts, &chunks),
        "a re-prefill runs prompt and generated tokens together"
    );
}

#[test]
fn a_cancelled_or_hung_up_job_leaves_before_the_next_step_and_frees_its_pages() {
    let tokenizer = tiny_tokenizer();
    let mut backend = ScriptedBackend::new(32, 10, script());
    let mut scheduler = Scheduler::new(config(4), 32, 10);
    let cancel = CancelToken::new();
    let admit = |s: &mut Scheduler<Job>, name, cancel: CancelToken, hang_up_after| {
        let seq = Sequence::new(request(prompt(20, name as u32), 50), cancel).unwrap();
        let job = Job {
            name,
            hang_up_after,
            ..Job::default()
        };
        s.admit(job, seq);
    };
    admit(&mut scheduler, 0, cancel.clone(), None);
    admit(&mut scheduler, 1, CancelToken::new(), Some(3));
    admit(&mut scheduler, 2, CancelToken::new(), None);
    for _ in 0..2 {
        assert!(scheduler.step(&mut backend, &tokenizer).is_empty());
    }
    let ended = scheduler.step(&mut backend, &tokenizer);
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].job.name, 1);
    assert!(matches!(ended[0].result, Err(GenerateError::Cancelled)));
    cancel.cancel();
    let ended = scheduler.step(&mut backend, &tokenizer);
    assert_eq!(ended.len(), 1);
    assert!(matches!(ended[0].result, Err(GenerateError::Cancelled)));
    assert_eq!(scheduler.stats().running, 1);
    assert_eq!(
        scheduler.stats().kv_pages_free,
        32 - 2,
        "the one left holds 2 pages; the others' cached pages count as free"
    );
}

#[test]
fn a_failed_step_fails_every_sequence_in_it() {
    let mut backend = ScriptedBackend::new(32, 10, script());
    backend.fail_at_step = Some(1);
    let requests = vec![request(prompt(4, 1), 5), request(prompt(6, 2), 5)];
    let results = run_all(config(2), &mut backend, requests);
    for (_, result) in results {
        assert!(matches!(
            result,
            Err(GenerateError::Backend(BackendError::Device(_)))
        ));
    }
}

#[test]
fn a_poisoning_fault_fails_its_step_and_every_later_one() {
    let mut backend = ScriptedBackend::new(32, 10, script());
    backend.fail_at_step = Some(1);
    backend.fail_poisons = true;
    // The second job is admitted after the first failed: its steps fail the same way.
    let requests = vec![request(prompt(4, 1), 5), request(prompt(6, 2), 5)];
    let results = run_all(config(1), &mut backend, requests);
    for (_, result) in results {
        let Err(GenerateError::Backend(err)) = result else {
            panic!("{result:?}");
        };
        assert!(err.poisons_device(), "{err:?}");
    }
}

#[test]
fn eos_stop_strings_and_utf8_are_handled_per_sequence() {
    // Prompt "a", then: Ã © x EOS (é split over two tokens, then x, then the end).
    let fixed: crate::testing::Script =
        Arc::new(|history: &[u32]| [5, 6, 7, TINY_EOS][(history.len() - 1).min(3)]);
    let texts = |job: &Job| -> Vec<String> {
        job.events
            .iter()
            .filter_map(|e| match e {
                GenerateEvent::Token { text, .. } => Some(text.clone()),
                GenerateEvent::Metrics { .. } => None,
            })
            .collect()
    };
    let mut backend = ScriptedBackend::new(8, 10, fixed.clone());
    let plain = run_all(config(1), &mut backend, vec![request(vec![1], 10)]);
    assert_eq!(texts(&plain[0].0), ["é", "x"]);
    assert_eq!(plain[0].1.as_ref().unwrap().stop_reason, StopReason::Eos);
    let mut stopped = request(vec![1], 10);
    stopped.stop = vec!["éx".into()];
    let mut backend = ScriptedBackend::new(8, 10, fixed.clone());
    let result = run_all(config(1), &mut backend, vec![stopped]);
    assert!(
        texts(&result[0].0).is_empty(),
        "nothing of a stop string is sent"
    );
    let done = result[0].1.as_ref().unwrap();
    assert_eq!(done.stop_reason, StopReason::StopSequence);
    assert_eq!(done.stop_sequence_matched.as_deref(), Some("éx"));
    let mut ignoring = request(vec![1], 6);
    ignoring.ignore_eos = true;
    let mut backend = ScriptedBackend::new(8, 10, fixed);
    let result = run_all(config(1), &mut backend, vec![ignoring]);
    let done = result[0].1.as_ref().unwrap();
    assert_eq!(
        (done.stop_reason, done.tokens.len()),
        (StopReason::MaxTokens, 6)
    );
}

#[test]
fn non_finite_logits_end_only_the_jobs_whose_tokens_made_them() {
    // Token 8 stands for a token with a broken embedding row: a history holding it gets NaN
    // logits. The script emits 8 once a sequence is 6 tokens long, else 1.
    let script: crate::testing::Script =
        Arc::new(|history: &[u32]| if history.len() >= 6 { 8 } else { 1 });
    let mut backend = ScriptedBackend::new(64, 10, script);
    backend.non_finite_on = Some(8);
    let greedy = |mut request: GenerateRequest| {
        request.sampling.temperature = 0.0;
        request
    };
    let results = run_all(
        config(4),
        &mut backend,
        vec![
            request(vec![1, 8, 2], 5),
            greedy(request(vec![8, 3], 5)),
            request(vec![1, 2, 3], 10),
            request(vec![1, 2], 3),
        ],
    );
    let first = |k: usize| match &results[k].1 {
        Err(GenerateError::Backend(BackendError::NonFiniteLogits { first })) => *first,
        other => panic!("job {k}: {other:?}"),
    };
    // The sampled job's logits row and the greedy job's host-side choice both report the NaN.
    assert!(matches!(first(0), Some((0, v)) if v.is_nan()));
    assert!(matches!(first(1), Some((0, v)) if v.is_nan()));
    assert!(results[0].0.events.is_empty() && results[1].0.events.is_empty());
    // Job 2 streamed three tokens and the 8, then failed on the next step.
    assert!(first(2).is_some());
    let streamed = results[2]
        .0
        .events
        .iter()
        .filter(|e| matches!(e, GenerateEvent::Token { .. }))
        .count();
    assert_eq!(streamed, 4, "{:?}", results[2].0.events);
    assert_eq!(tokens(&results[3].1), vec![1, 1, 1], "the job beside them");
}

/// A job under a grammar whose masks take `mask_delay` each beside a plain one (prompts of 5
/// and 14 tokens, so their decodes are told apart by position): each gets the tokens it gets
/// alone; returns the steps holding the grammar job's decodes and those holding the plain
/// job's.
fn grammar_beside_plain(mask_delay: Duration) -> (Vec<usize>, Vec<usize>) {
    use crate::grammar::{GrammarSpec, Grammars};
    let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
    let spec = GrammarSpec::Regex("[abc]+".into());
    let mut constrained = request(prompt(5, 0), 4);
    constrained.grammar = Some(grammars.compile(&spec).unwrap().with_mask_delay(mask_delay));
    let requests = vec![constrained, request(prompt(14, 1), 20)];
    let alone = each_alone(&requests);
    let mut backend = ScriptedBackend::new(64, 10, script());
    let steps = backend.steps();
    let together = run_all(config(2), &mut backend, requests);
    for (i, (_, result)) in together.iter().enumerate() {
        assert_eq!(tokens(result), alone[i], "job {i}");
    }
    let steps = steps.lock().unwrap();
    let decodes_at = |from: usize, to: usize| -> Vec<usize> {
        (0..steps.len())
            .filter(|&k| {
                steps[k]
                    .chunks
                    .iter()
                    .any(|&(p, n)| n == 1 && (from..to).contains(&p))
            })
            .collect()
    };
    (decodes_at(5, 9), decodes_at(14, 34))
}

/// Masks of 300 ms (a grammar known to be slow): the plain job's decodes never wait for them.
/// It finishes all its tokens before the slow job's first decode.
#[test]
fn a_slow_grammar_mask_holds_only_its_own_sequence() {
    let (slow, plain) = grammar_beside_plain(Duration::from_millis(300));
    assert_eq!((slow.len(), plain.len()), (3, 19));
    assert!(
        plain.last() < slow.first(),
        "the plain job waited: its decodes in steps {plain:?}, the slow job's in {slow:?}"
    );
}

/// Quick masks are waited for inside the step (the CUDA backend overlaps that wait with the
/// pass): the grammar job decodes in every step beside the plain one, never sitting one out.
#[test]
fn a_quick_grammar_mask_keeps_its_sequence_in_every_step() {
    let (quick, plain) = grammar_beside_plain(Duration::ZERO);
    assert_eq!(quick, [1, 2, 3], "the plain job's decodes: {plain:?}");
}
