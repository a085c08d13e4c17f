//! The renderer process's side: compile and render templates as the worker asks, under a heap
//! cap, until the worker closes the pipe.

use std::io::{self, BufReader, BufWriter, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::wire::{self, Reply, Request};
use super::{RENDER_MEMORY_BYTES, RENDERER_ENV, allocator};
use crate::tokenizer::template::{ChatTemplate, TemplateError};

/// When this process was started as a renderer ([`RENDERER_ENV`] set), serves renders on
/// stdin/stdout and exits; otherwise returns at once. Call it first thing in `main` of every
/// binary that uses [`super::TemplateProcess`], before parsing arguments.
pub fn serve_if_renderer() {
    let Some(cap) = std::env::var_os(RENDERER_ENV) else {
        return;
    };
    let cap = cap
        .to_str()
        .and_then(|cap| cap.parse().ok())
        .unwrap_or(RENDER_MEMORY_BYTES);
    #[cfg(unix)]
    die_with_the_worker();
    let capped = allocator::enforce(cap);
    let code = match serve(capped) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    std::process::exit(code);
}

/// Ends this renderer soon after the worker that started it dies: a worker killed with SIGKILL
/// cannot stop a render that runs on (fuel does not count a filter walking a huge lazy
/// sequence), and closing the pipe only ends the renderer between renders. A watch thread
/// (rather than Linux's parent-death signal, which follows the spawning thread, and the worker
/// spawns from short-lived blocking threads) checks the parent every 100 ms.
#[cfg(unix)]
fn die_with_the_worker() {
    let parent = std::os::unix::process::parent_id();
    let watch = move || {
        while std::os::unix::process::parent_id() == parent {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        std::process::exit(1);
    };
    if std::thread::Builder::new()
        .name("worker-watch".into())
        .spawn(watch)
        .is_err()
    {
        std::process::exit(1);
    }
}

fn serve(capped: bool) -> io::Result<()> {
    let mut input = BufReader::new(io::stdin().lock());
    let mut output = BufWriter::new(io::stdout().lock());
    let mut template = None;
    while let Some(request) = wire::read_request(&mut input)? {
        let reply = if capped {
            answer(request, &mut template)
        } else {
            Err(TemplateError::Process(
                "the renderer cannot cap its memory: this binary does not install \
                 worker_common's BudgetAllocator as its global allocator"
                    .into(),
            ))
        };
        wire::write_reply(&mut output, &reply)?;
        output.flush()?;
    }
    Ok(())
}

fn answer(request: Request, template: &mut Option<ChatTemplate>) -> Reply {
    match request {
        Request::Load {
            source,
            bos_token,
            eos_token,
        } => {
            *template = None;
            *template = Some(ChatTemplate::new(&source, &bos_token, &eos_token)?);
            Ok(String::new())
        }
        Request::Render {
            messages,
            tools,
            add_generation_prompt,
            add_bos,
            add_eos,
        } => {
            let Some(template) = template else {
                return Err(TemplateError::Process("no template was loaded".into()));
            };
            // A MiniJinja panic ends this render, not the renderer.
            catch_unwind(AssertUnwindSafe(|| {
                let tools = (!tools.is_empty()).then_some(tools.as_str());
                template.render_prompt(&messages, tools, add_generation_prompt, add_bos, add_eos)
            }))
            .unwrap_or_else(|_| {
                Err(TemplateError::Process(
                    "the template engine panicked during the render".into(),
                ))
            })
        }
    }
}
