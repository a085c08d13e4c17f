//! What a grammar costs on a real vocabulary, and what [`Grammars::compile`]'s budget makes of
//! it: the forced tool call of a tool whose parameters nest arrays `depth` deep
//! (scripts/bench-hostile-grammar.py's hostile shape), and a few ordinary schemas. For each:
//! what llguidance's limits measure with its own defaults (the lexer's states and build fuel,
//! the largest step's Earley items and lexer fuel over the masks of a valid call and of a
//! seeded random walk, the worst mask's time), then the outcome under the worker's budget
//! (compiled or refused, and why) and its time, compiled again (the cache), and the masks of a
//! valid call through the worker's parser. The budget constants of worker-common's
//! grammar_budget.rs were chosen from its numbers.
//!
//! ```sh
//! cargo run --release -p worker-common --example grammar_cost -- <model.gguf> [depth...]
//! ```

use std::time::Instant;

use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use worker_common::gguf::Gguf;
use worker_common::grammar::{GrammarSpec, Grammars, token_env, top_level};
use worker_common::tokenizer::Tokenizer;

/// The most masks measured per grammar.
const MAX_MASKS: usize = 256;

/// Parameters whose one property is an array of arrays … `depth` deep of integers.
fn nested(depth: usize) -> Value {
    let mut inner = json!({"type": "integer"});
    for _ in 0..depth {
        inner = json!({"type": "array", "items": inner});
    }
    json!({"type": "object", "properties": {"v": inner}, "required": ["v"]})
}

/// The forced call grammar worker-http builds for one Hermes-format tool.
fn forced_call(name: &str, parameters: &Value) -> GrammarSpec {
    let schema = json!({
        "anyOf": [{"type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": false}],
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    });
    GrammarSpec::Lark(format!(
        "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
    ))
}

/// An OpenAI structured-output schema of the usual size: nested objects, enums, arrays.
fn structured_output() -> Value {
    json!({"type": "object", "properties": {
        "title": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "object", "properties": {
            "explanation": {"type": "string"}, "output": {"type": "string"}},
            "required": ["explanation", "output"], "additionalProperties": false}},
        "final_answer": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["math", "code", "text"]}}},
        "required": ["title", "steps", "final_answer"], "additionalProperties": false})
}

/// llguidance's factory over `tokenizer`'s vocabulary with its default limits (the worker's
/// token environment, not its budget).
fn default_factory(tokenizer: &Tokenizer) -> Result<ParserFactory, Box<dyn std::error::Error>> {
    let (env, _) = token_env(tokenizer)?;
    let mut factory = ParserFactory::new_simple(&env)?;
    factory.quiet();
    factory.limits_mut().verbose_errors = false;
    Ok(factory)
}

/// What llguidance's limits measure of `spec` under its defaults, over the masks of `tokens`.
fn measure(factory: &ParserFactory, spec: &GrammarSpec, tokens: &[u32]) {
    let started = Instant::now();
    let parser = match factory.create_parser(top_level(spec)) {
        Ok(parser) => parser,
        Err(error) => {
            println!("  llguidance defaults: refused: {}", first_line(&error));
            return;
        }
    };
    let built = started.elapsed().as_secs_f64() * 1e3;
    let lexer = parser.parser.lexer_stats();
    println!(
        "  lexer: {} states, fuel {}",
        lexer.num_states, lexer.total_fuel_spent
    );
    let mut matcher = Matcher::new(Ok(parser));
    let (mut items, mut fuel, mut worst, mut first) = (0, 0, 0.0f64, None);
    let mut masks = 0;
    for (i, &token) in std::iter::once(&u32::MAX)
        .chain(tokens.iter().take(MAX_MASKS))
        .enumerate()
    {
        if i > 0
            && let Err(error) = matcher.consume_token(token)
        {
            println!("  token {i}: {}", first_line(&error));
            break;
        }
        let one = Instant::now();
        if let Err(error) = matcher.compute_mask_or_eos() {
            println!("  mask {i}: {}", first_line(&error));
            break;
        }
        let ms = one.elapsed().as_secs_f64() * 1e3;
        if let Ok(stats) = matcher.last_step_stats() {
            items = items.max(stats.all_items);
            fuel = fuel.max(stats.lexer_cost);
            first.get_or_insert((stats.all_items, stats.lexer_cost, ms));
        }
        worst = worst.max(ms);
        masks += 1;
    }
    let (first_items, first_fuel, first_ms) = first.unwrap_or_default();
    println!(
        "  llguidance defaults: built in {built:.1} ms; first mask {first_items} items, \
         fuel {first_fuel}, {first_ms:.2} ms; over {masks} masks at most {items} items, fuel {fuel}, {worst:.2} ms"
    );
}

/// What llguidance's limits measure of `spec` under its defaults over a random walk: after
/// `prefix`, [`MAX_MASKS`] tokens each drawn uniformly from its mask (seeded, so repeatable),
/// the paths a model's calls take that one valid text does not.
fn random_walk(factory: &ParserFactory, spec: &GrammarSpec, prefix: &[u32]) {
    let Ok(parser) = factory.create_parser(top_level(spec)) else {
        return;
    };
    let mut matcher = Matcher::new(Ok(parser));
    let (mut items, mut fuel, mut worst, mut total, mut masks) = (0, 0, 0.0f64, 0.0f64, 0);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for step in 0..MAX_MASKS {
        let one = Instant::now();
        let mask = match matcher.compute_mask_or_eos() {
            Ok(mask) => mask,
            Err(error) => {
                println!("  random walk, mask {step}: {}", first_line(&error));
                break;
            }
        };
        let ms = one.elapsed().as_secs_f64() * 1e3;
        (worst, total, masks) = (worst.max(ms), total + ms, masks + 1);
        if let Ok(stats) = matcher.last_step_stats() {
            (items, fuel) = (items.max(stats.all_items), fuel.max(stats.lexer_cost));
        }
        if matcher.is_stopped() {
            break;
        }
        let token = match prefix.get(step) {
            Some(&token) => token,
            None => {
                let allowed: Vec<u32> = (0..mask.len() as u32)
                    .filter(|&id| mask.is_allowed(id))
                    .collect();
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                match allowed.get((state >> 33) as usize % allowed.len().max(1)) {
                    Some(&token) => token,
                    None => break,
                }
            }
        };
        if let Err(error) = matcher.consume_token(token) {
            println!("  random walk, token {step}: {}", first_line(&error));
            break;
        }
    }
    println!(
        "  random walk: {masks} masks, at most {items} items, fuel {fuel}, {:.2} ms on average, worst {worst:.2} ms",
        total / f64::from(masks.max(1))
    );
}

fn first_line(error: &impl std::fmt::Display) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `text`'s tokens: the grammar spells `<tool_call>` out in text (a vocabulary's special token
/// of that name is behind llguidance's marker byte), so its `<` is encoded alone.
fn tokens_of(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let mut tokens = Vec::new();
    let pieces = match text.strip_prefix('<') {
        Some(rest) => ["<", rest],
        None => ["", text],
    };
    for piece in pieces.into_iter().filter(|piece| !piece.is_empty()) {
        tokens.extend(tokenizer.encode(piece, false, false)?);
    }
    Ok(tokens)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .ok_or("usage: grammar_cost <model.gguf> [depth...]")?;
    let depths: Vec<usize> = match args.map(|a| a.parse()).collect::<Result<Vec<_>, _>>()? {
        depths if depths.is_empty() => vec![10, 20, 30, 40, 50],
        depths => depths,
    };
    let gguf = Gguf::open(&model)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let started = Instant::now();
    let grammars = Grammars::new(&tokenizer)?;
    println!(
        "vocabulary {} tokens, compiler built in {:.0} ms",
        tokenizer.vocab().len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let factory = default_factory(&tokenizer)?;
    let weather = json!({"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "hourly": {"type": "boolean"}},
        "required": ["location"]});
    let answer = "{\"title\": \"t\", \"steps\": [{\"explanation\": \"e\", \"output\": \"o\"}], \
        \"final_answer\": \"42\", \"confidence\": 0.5, \"tags\": [\"math\"]}";
    let mut cases: Vec<(String, GrammarSpec, String)> = vec![
        (
            "json_object".into(),
            GrammarSpec::JsonObject,
            "{\"a\": 1}".into(),
        ),
        (
            "structured output".into(),
            GrammarSpec::JsonSchema(structured_output()),
            answer.into(),
        ),
        (
            "weather tool".into(),
            forced_call("get_weather", &weather),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}"
                .into(),
        ),
    ];
    for depth in depths {
        // Deep, then wider near the bottom: a model's call closes and reopens arrays.
        let (open, close) = ("[".repeat(depth), "]".repeat(depth));
        let (half, halfway) = ("[".repeat(depth / 2), "]".repeat(depth / 2));
        let value = format!("{open}1, 2{halfway}, {half}3, 4{close}");
        let text = format!("<tool_call>\n{{\"name\": \"t\", \"arguments\": {{\"v\": {value}}}}}");
        cases.push((
            format!("{depth}-deep arrays tool"),
            forced_call("t", &nested(depth)),
            text,
        ));
    }
    // Shapes that are costly in llguidance's own terms: a regular expression whose automaton
    // doubles with each repetition (its masks spend lexer fuel), an ambiguous Lark grammar
    // (Earley items), a schema of ten thousand properties (grammar size).
    let many = |n: usize| -> Value {
        let properties: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("p{i}"), json!({"type": "integer"})))
            .collect();
        json!({"type": "object", "properties": properties})
    };
    cases.extend([
        (
            "exponential regex".into(),
            GrammarSpec::Regex("(a|b)*a(a|b){24}".into()),
            "ab".repeat(40),
        ),
        (
            "ambiguous lark".into(),
            GrammarSpec::Lark("start: s\ns: s s | s s s | \"a\" | \"aa\"".into()),
            "a".repeat(60),
        ),
        (
            "enum of 1,000 values".into(),
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"country": {
                "enum": (0..1_000).map(|i| format!("Country name {i}")).collect::<Vec<_>>()}},
                "required": ["country"]})),
            "{\"country\": \"Country name 7\"}".into(),
        ),
    ]);
    for n in [100, 400, 500, 1_000, 2_000, 4_000, 10_000] {
        let text = "{\"p1\": 1}".to_owned();
        cases.push((
            format!("{n} optional properties"),
            GrammarSpec::JsonSchema(many(n)),
            text,
        ));
    }
    for (name, spec, text) in cases {
        println!("{name}:");
        // The grammar spells `<tool_call>` out in text (a vocabulary's special token of that
        // name is behind llguidance's marker byte): its `<` is encoded alone.
        let tokens = tokens_of(&tokenizer, &text)?;
        measure(&factory, &spec, &tokens);
        // The walk starts where the value starts: after the call's name (its own text).
        let prefix = text.find(": {\"v\": ").map_or(0, |at| at + 7);
        let prefix_tokens: Vec<u32> = match prefix {
            0 => Vec::new(),
            _ => tokens_of(&tokenizer, &text[..prefix])?,
        };
        random_walk(&factory, &spec, &prefix_tokens);
        for round in ["", " (again)"] {
            let started = Instant::now();
            let compiled = grammars.compile(&spec);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let mut guide = match compiled {
                Ok(constraint) => {
                    println!("  worker{round}: compiled in {ms:.2} ms");
                    constraint.start()
                }
                Err(error) => {
                    println!("  worker{round}: refused in {ms:.2} ms: {error}");
                    continue;
                }
            };
            if !round.is_empty() {
                continue;
            }
            let (mut masks, mut worst, started) = (0, 0.0f64, Instant::now());
            for &token in tokens.iter().take(MAX_MASKS) {
                let one = Instant::now();
                if let Err(error) = guide.accept(token).and_then(|()| guide.allowed().map(drop)) {
                    println!("  token {masks}: {error}");
                    break;
                }
                worst = worst.max(one.elapsed().as_secs_f64() * 1e3);
                masks += 1;
            }
            let total = started.elapsed().as_secs_f64() * 1e3;
            println!(
                "  {masks} masks: {:.2} ms each on average, worst {worst:.2} ms",
                total / masks.max(1) as f64
            );
        }
    }
    Ok(())
}
