//! Speculation through the scheduler over the scripted backend: grammars and a draft model.

use super::*;

/// A greedy job under a grammar speculates: drafts are verified without a mask, a choice the
/// grammar refuses runs again with it, and the job gets the tokens it gets without drafts.
#[test]
fn a_grammar_job_speculates_and_keeps_its_tokens() {
    use crate::grammar::{GrammarSpec, Grammars};
    let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
    // Repeats its last three tokens, except an `x` (refused by the grammar) every fifth.
    let copying: crate::testing::Script = Arc::new(|history: &[u32]| {
        if history.len().is_multiple_of(5) {
            7
        } else {
            history[history.len() - 3]
        }
    });
    let run = |draft_max: usize| {
        let mut request = request(vec![1, 2, 3, 1, 2, 3, 1, 2, 3], 20);
        request.sampling.temperature = 0.0;
        let spec = GrammarSpec::Regex("[abc]{12}".into());
        request.grammar = Some(grammars.compile(&spec).unwrap());
        let mut backend = ScriptedBackend::new(64, 10, copying.clone());
        let steps = backend.steps();
        let config = SchedulerConfig {
            draft_max,
            ..config(1)
        };
        let result = run_all(config, &mut backend, vec![request]).remove(0).1;
        let verified = steps
            .lock()
            .unwrap()
            .iter()
            .skip(1)
            .any(|s| s.chunks[0].1 > 1);
        (tokens(&result), verified)
    };
    let (plain, _) = run(0);
    let (fast, verified) = run(8);
    assert_eq!(fast, plain);
    assert!(verified, "no verify pass ran");
    assert_eq!(plain.len(), 12, "{plain:?}");
    assert!(plain.iter().all(|t| (1..=3).contains(t)), "{plain:?}");
}

/// A draft model (the scripted backend with a script that differs from the model's every
/// fourth position) drafts for greedy and sampled jobs, one of them with a prompt longer than
/// a catch-up piece: each job gets the tokens it gets without drafts, and drafts are accepted.
#[test]
fn a_draft_model_drafts_and_every_job_keeps_its_tokens() {
    use crate::schedule::{CATCH_UP, DraftModel};
    let drafting: crate::testing::Script = Arc::new(|history: &[u32]| {
        let target = script()(history);
        if history.len().is_multiple_of(4) {
            target % 9 + 1
        } else {
            target
        }
    });
    let requests: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let len = if i == 0 { 3 * CATCH_UP + 5 } else { 5 + i * 7 };
            let mut request = request(prompt(len, i as u32), 24);
            request.sampling.temperature = if i % 2 == 0 { 0.0 } else { 1.0 };
            request
        })
        .collect();
    let alone = each_alone(&requests);
    let tokenizer = tiny_tokenizer();
    let config = SchedulerConfig {
        draft_max: 6,
        ..config(4)
    };
    let mut backend = ScriptedBackend::new(128, 10, script());
    let mut scheduler = Scheduler::new(config, backend.kv_pages(), backend.vocab_size());
    let draft = ScriptedBackend::new(128, 10, drafting);
    scheduler.set_drafter(Box::new(DraftModel::new(draft)));
    for (name, request) in requests.into_iter().enumerate() {
        let seq = Sequence::new(request, CancelToken::new()).unwrap();
        let job = Job {
            name,
            ..Job::default()
        };
        scheduler.admit(job, seq);
    }
    let mut results = vec![None; 4];
    while !scheduler.is_idle() {
        for done in scheduler.step(&mut backend, &tokenizer) {
            results[done.job.name] = Some(tokens(&done.result));
        }
    }
    for (i, got) in results.iter().enumerate() {
        assert_eq!(got.as_ref(), Some(&alone[i]), "job {i}");
    }
    let stats = scheduler.stats();
    assert!(stats.accepted_tokens > 0, "{stats:?}");
    assert!(stats.accepted_tokens < stats.drafted_tokens, "{stats:?}");
    assert_eq!(stats.kv_pages_free, 128);
}

#[test]
fn a_draft_model_runs_no_step_when_nobody_drafts() {
    use crate::schedule::{DraftModel, DraftWant, Drafter};
    let backend = ScriptedBackend::new(16, 10, script());
    let steps = backend.steps();
    let mut model = DraftModel::new(backend);
    let history = [1, 2, 3];
    let resting = DraftWant {
        id: 1,
        history: &history,
        most: 0,
    };
    assert_eq!(model.draft(&[]), Vec::<Vec<u32>>::new());
    assert_eq!(model.draft(&[resting]), vec![Vec::<u32>::new()]);
    assert!(steps.lock().unwrap().is_empty(), "no step ran");
    assert_eq!(model.step_seconds(), 0.0, "nothing measured");
}
