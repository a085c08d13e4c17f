//! Running cases: the `Runner` that parses each case under the heap budget and collects
//! failures, what a case must do, and the self-consistency checks of an accepted file.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};

use worker_common::gguf::{Gguf, MAX_ARRAY_DEPTH, Value};

use crate::heap::measure;
use crate::{HEAP_FACTOR, HEAP_SLACK};

// --- Running cases ----------------------------------------------------------------------------

/// What a case's file must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Parse or be refused; either way without panicking.
    Any,
    /// Be refused: the mutation makes the file certainly invalid.
    Err,
    /// Parse.
    Ok,
}

/// Runs cases and collects what went wrong, so one run reports every failing case.
#[derive(Default)]
pub(crate) struct Runner {
    pub(crate) cases: usize,
    per_family: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
    worst_ratio: f64,
    worst_case: String,
}

impl Runner {
    pub(crate) fn case(
        &mut self,
        family: &'static str,
        desc: String,
        expect: Expect,
        bytes: &[u8],
    ) {
        let label = format!("case #{} [{family}] {desc}", self.cases);
        self.cases += 1;
        *self.per_family.entry(family).or_default() += 1;
        if let Err(problem) = self.check(expect, bytes, &label) {
            self.failures.push(format!("{label}: {problem}"));
        }
    }

    fn check(&mut self, expect: Expect, bytes: &[u8], label: &str) -> Result<(), String> {
        let (outcome, peak) = measure(|| panic::catch_unwind(|| Gguf::parse(bytes)));
        let ratio = peak as f64 / bytes.len().max(1) as f64;
        if ratio > self.worst_ratio {
            self.worst_ratio = ratio;
            self.worst_case = label.to_owned();
        }
        if peak > HEAP_FACTOR * bytes.len() + HEAP_SLACK {
            let len = bytes.len();
            return Err(format!(
                "parse peaked at {peak} heap bytes for {len} file bytes"
            ));
        }
        let parsed =
            outcome.map_err(|payload| format!("parse panicked: {}", panic_message(&*payload)))?;
        match (parsed, expect) {
            (Ok(_), Expect::Err) => Err("accepted a file that must be refused".to_owned()),
            (Err(err), Expect::Ok) => Err(format!("refused a valid file: {err}")),
            (Err(_), _) => Ok(()),
            (Ok(gguf), _) => panic::catch_unwind(AssertUnwindSafe(|| consistent(&gguf, bytes)))
                .unwrap_or_else(|payload| {
                    Err(format!("accessor panicked: {}", panic_message(&*payload)))
                }),
        }
    }

    /// Prints the counts and the worst heap ratio; fails on any failing case, or when the
    /// families ran other numbers of cases than `expected`.
    pub(crate) fn finish(self, expected: &[(&'static str, usize)]) {
        eprintln!("gguf_mutation: {} cases", self.cases);
        for (family, count) in &self.per_family {
            eprintln!("  {family:<15} {count:>6}");
        }
        eprintln!(
            "gguf_mutation: worst heap ratio {:.2} × file length ({})",
            self.worst_ratio, self.worst_case
        );
        let shown: Vec<&String> = self.failures.iter().take(30).collect();
        assert!(
            self.failures.is_empty(),
            "{} failing cases, first ones:\n{shown:#?}",
            self.failures.len()
        );
        let expected: BTreeMap<&str, usize> = expected.iter().copied().collect();
        assert_eq!(
            self.per_family, expected,
            "case counts differ from the documented ones"
        );
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

// --- Self-consistency of an accepted file -----------------------------------------------------

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Checks what an accepted file exposes against the file itself.
fn consistent(gguf: &Gguf<&[u8]>, file: &[u8]) -> Result<(), String> {
    let alignment = gguf.alignment();
    ensure!(alignment.is_power_of_two(), "alignment {alignment}");
    ensure!(
        (gguf.data_offset() as u64).is_multiple_of(alignment),
        "data offset {} unaligned",
        gguf.data_offset()
    );
    for (key, value) in gguf.metadata() {
        ensure!(
            gguf.get(key).is_some_and(|v| same(v, value)),
            "lookup of key {key:?}"
        );
        walk_value(value, 0)?;
    }
    let mut spans = Vec::new();
    for tensor in gguf.tensors() {
        spans.push(tensor_span(gguf, file, tensor.name)?);
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        ensure!(
            pair[0].1 <= pair[1].0,
            "tensor data {:?} and {:?} overlap",
            pair[0],
            pair[1]
        );
    }
    Ok(())
}

/// Checks one tensor's size, position and lookup; returns its byte range in the file.
fn tensor_span(gguf: &Gguf<&[u8]>, file: &[u8], name: &str) -> Result<(usize, usize), String> {
    let t = gguf
        .tensor(name)
        .ok_or_else(|| format!("lookup of tensor {name:?}"))?;
    ensure!(
        (1..=4).contains(&t.shape.len()),
        "{name:?}: {} dims",
        t.shape.len()
    );
    let (block, block_bytes) = (t.ggml_type.block_size(), t.ggml_type.block_bytes());
    ensure!(
        t.shape[0] % block == 0,
        "{name:?}: row {} not whole blocks",
        t.shape[0]
    );
    let size = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| (n / block).checked_mul(block_bytes));
    ensure!(
        size == Some(t.data.len() as u64),
        "{name:?}: {} bytes for shape {:?}",
        t.data.len(),
        t.shape
    );
    let start = (t.data.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
    let end = start
        .checked_add(t.data.len())
        .filter(|&end| end <= file.len());
    let end = end.ok_or_else(|| format!("{name:?}: data lies outside the file"))?;
    ensure!(
        start as u64 == gguf.data_offset() as u64 + t.offset,
        "{name:?}: data not at its offset"
    );
    ensure!(
        t.offset % gguf.alignment() == 0,
        "{name:?}: offset {} unaligned",
        t.offset
    );
    Ok((start, end))
}

/// Iterates an array down to its innermost elements, checking types and counts.
fn walk_value(value: Value<'_>, depth: usize) -> Result<(), String> {
    let Value::Array(array) = value else {
        return Ok(());
    };
    ensure!(depth < MAX_ARRAY_DEPTH, "arrays nested {} deep", depth + 1);
    let mut seen = 0u64;
    for element in array.iter() {
        ensure!(
            element.value_type() == array.element_type(),
            "element of another type"
        );
        walk_value(element, depth + 1)?;
        seen += 1;
    }
    ensure!(
        seen == array.len(),
        "array of {} yields {seen}",
        array.len()
    );
    Ok(())
}

/// Equality that holds for NaN floats too: files may store any bit pattern.
fn same(a: Value<'_>, b: Value<'_>) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}
