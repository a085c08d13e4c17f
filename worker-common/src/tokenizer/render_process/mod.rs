//! Chat templates rendered in a child process with a capped heap and a deadline.
//!
//! Templates come from model files, which users download from anywhere. MiniJinja's fuel bounds
//! a render's instructions, but a value can still grow past any memory in a few dozen of them
//! (`{% set ns.x = ns.x ~ ns.x %}` in a loop), and Rust aborts the process when an allocation
//! fails. So the worker renders in a helper process: the worker's own executable started again
//! with [`RENDERER_ENV`] set, which [`serve_if_renderer`] turns into a render loop on its stdin and
//! stdout under a [`RENDER_MEMORY_BYTES`] heap cap ([`BudgetAllocator`]). A render that goes past
//! the cap or runs past [`RENDER_TIMEOUT`] fails with [`TemplateError::Budget`], one that crashes
//! the renderer with [`TemplateError::Process`]; the next render starts a new renderer. Up to
//! [`MAX_RENDERERS`] render at once, so renders that trip their budget cannot make every other
//! request wait (a chat prompt renders in well under a millisecond).

mod allocator;
mod child;
mod wire;

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

pub use allocator::{BudgetAllocator, HEAP_CAP_EXIT_CODE};
pub use child::serve_if_renderer;

use crate::tokenizer::template::{ChatMessage, TemplateError};
use wire::{Reply, Request};

/// The environment variable that makes a worker binary a renderer, its value the heap cap in
/// bytes (internal: set only by [`TemplateProcess`]).
pub const RENDERER_ENV: &str = "LLORCH_INTERNAL_TEMPLATE_RENDERER";

/// Most live heap a renderer may hold: far above any chat prompt (renders stop at 16 MiB of
/// output; MiniJinja caps `*` repetition at 100 MB).
pub const RENDER_MEMORY_BYTES: usize = 512 << 20;

/// Longest a load or render may take before the renderer is killed. Fuel stops a looping
/// template within a fraction of a second; this catches what fuel does not count (a large
/// filter over a huge value).
pub const RENDER_TIMEOUT: Duration = Duration::from_secs(2);

/// Most renderers one template runs at once: renders take turns beyond it. A render that trips
/// its budget holds a renderer for up to [`RENDER_TIMEOUT`]; with several, innocent requests
/// find another (one renderer made one waited 7.9 s behind four such renders).
pub const MAX_RENDERERS: usize = 8;

/// A chat template compiled and rendered in renderer processes, up to [`MAX_RENDERERS`].
#[derive(Debug)]
pub struct TemplateProcess {
    state: Mutex<State>,
    /// Signalled when a renderer is given back or a place for one frees up.
    given_back: Condvar,
    /// The renderer's heap cap in bytes.
    memory_cap: usize,
}

/// The template, and the renderers not rendering now.
#[derive(Debug)]
struct State {
    /// The `Load` request that sets the template up in a fresh renderer.
    load: Request,
    /// Bumped by [`TemplateProcess::replace_template`]: a renderer loaded before reloads.
    generation: u64,
    idle: Vec<(Renderer, u64)>,
    /// Renderers that exist: idle, rendering or starting.
    live: usize,
}

impl TemplateProcess {
    /// Starts a renderer and compiles `source` there; a template that does not compile is
    /// [`TemplateError::Syntax`], as with [`crate::tokenizer::template::ChatTemplate::new`].
    pub fn start(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        Self::start_capped(source, bos_token, eos_token, RENDER_MEMORY_BYTES)
    }

    /// [`TemplateProcess::start`] with a heap cap of `memory_cap` bytes instead of
    /// [`RENDER_MEMORY_BYTES`] (the fuzzer uses a smaller one to reach the cap sooner).
    pub fn start_capped(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        memory_cap: usize,
    ) -> Result<Self, TemplateError> {
        let process = Self {
            state: Mutex::new(State {
                load: load_request(source, bos_token, eos_token),
                generation: 0,
                idle: Vec::new(),
                live: 0,
            }),
            given_back: Condvar::new(),
            memory_cap,
        };
        process.with_renderer(|_| Ok(String::new()))?;
        Ok(process)
    }

    /// Compiles another template in a renderer, for renders from now on (the others reload it
    /// before their next render); cheaper than [`TemplateProcess::start`] when many templates
    /// are tried (the fuzzer).
    pub fn replace_template(
        &self,
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<(), TemplateError> {
        {
            let mut state = self.lock();
            state.load = load_request(source, bos_token, eos_token);
            state.generation += 1;
        }
        self.with_renderer(|_| Ok(String::new()))?;
        Ok(())
    }

    /// [`crate::tokenizer::template::ChatTemplate::render_prompt`], in a renderer.
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<String, TemplateError> {
        let request = Request::Render {
            messages: messages.to_vec(),
            tools: tools.unwrap_or_default().to_owned(),
            add_generation_prompt,
            add_bos,
            add_eos,
        };
        self.with_renderer(|renderer| renderer.ask(&request))
    }

    /// Runs `work` on a renderer that has the current template loaded: an idle one, else a new
    /// one while fewer than [`MAX_RENDERERS`] exist, else the first given back. A renderer that
    /// failed is dropped (killed), so a later call starts a fresh one.
    fn with_renderer(
        &self,
        work: impl FnOnce(&mut Renderer) -> Reply,
    ) -> Result<String, TemplateError> {
        let (taken, load, generation) = self.take();
        let mut renderer = match taken {
            Some((renderer, loaded)) if loaded == generation => renderer,
            Some((renderer, _)) => self.loaded(renderer, &load)?,
            None => match Renderer::spawn(self.memory_cap) {
                Ok(fresh) => self.loaded(fresh, &load)?,
                Err(err) => {
                    self.discard(None);
                    return Err(err);
                }
            },
        };
        let reply = work(&mut renderer);
        if renderer.broken {
            self.discard(Some(renderer));
        } else {
            self.lock().idle.push((renderer, generation));
            self.given_back.notify_one();
        }
        reply
    }

    /// `renderer` with the template of `load` compiled in it; a renderer whose load failed
    /// (the template does not compile, or it died) is discarded.
    fn loaded(&self, mut renderer: Renderer, load: &Request) -> Result<Renderer, TemplateError> {
        match renderer.ask(load) {
            Ok(_) => Ok(renderer),
            Err(err) => {
                self.discard(Some(renderer));
                Err(err)
            }
        }
    }

    /// Gives up a renderer's place (killing the renderer, if one was started).
    fn discard(&self, renderer: Option<Renderer>) {
        self.lock().live -= 1;
        drop(renderer);
        self.given_back.notify_one();
    }

    /// An idle renderer and the generation it has loaded, or `None` with a place taken for a
    /// new one; with the load request and generation in force.
    fn take(&self) -> (Option<(Renderer, u64)>, Request, u64) {
        let mut state = self.lock();
        loop {
            if let Some(idle) = state.idle.pop() {
                return (Some(idle), state.load.clone(), state.generation);
            }
            if state.live < MAX_RENDERERS {
                state.live += 1;
                return (None, state.load.clone(), state.generation);
            }
            state = self
                .given_back
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn load_request(source: &str, bos_token: &str, eos_token: &str) -> Request {
    Request::Load {
        source: source.to_owned(),
        bos_token: bos_token.to_owned(),
        eos_token: eos_token.to_owned(),
    }
}

/// A live renderer process and the channel its replies arrive on.
#[derive(Debug)]
struct Renderer {
    child: Child,
    memory_cap: usize,
    requests: BufWriter<ChildStdin>,
    replies: Receiver<std::io::Result<Reply>>,
    /// The renderer died, timed out or garbled a reply: it must not be asked again.
    broken: bool,
}

impl Renderer {
    fn spawn(memory_cap: usize) -> Result<Self, TemplateError> {
        let failed = |what: &str, err: &dyn std::fmt::Display| {
            TemplateError::Process(format!(
                "could not start the chat template renderer ({what}): {err}"
            ))
        };
        let executable: PathBuf =
            std::env::current_exe().map_err(|err| failed("finding this executable", &err))?;
        // A clean environment: the renderer needs none of the worker's (its API key included).
        let mut command = Command::new(&executable);
        command
            .env_clear()
            .env(RENDERER_ENV, memory_cap.to_string());
        if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
            command.env("LD_LIBRARY_PATH", paths);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| failed(&executable.display().to_string(), &err))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(TemplateError::Process("the renderer has no pipes".into()));
        };
        // A reader thread turns the blocking pipe into a channel, so a reply can have a deadline.
        let (sender, replies) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("template-replies".into())
            .spawn(move || {
                let mut stdout = BufReader::new(stdout);
                loop {
                    let reply = wire::read_reply(&mut stdout);
                    let ended = reply.is_err();
                    if sender.send(reply).is_err() || ended {
                        break;
                    }
                }
            });
        if let Err(err) = spawned {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed("its reader thread", &err));
        }
        Ok(Self {
            child,
            memory_cap,
            requests: BufWriter::new(stdin),
            replies,
            broken: false,
        })
    }

    /// Sends `request` and waits up to [`RENDER_TIMEOUT`] for its reply.
    fn ask(&mut self, request: &Request) -> Reply {
        let memory_cap = self.memory_cap;
        let sent =
            wire::write_request(&mut self.requests, request).and_then(|()| self.requests.flush());
        let reply = match sent {
            Ok(()) => self.replies.recv_timeout(RENDER_TIMEOUT),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match reply {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => match self.stop() {
                Ok(status) if status.code() == Some(HEAP_CAP_EXIT_CODE) => Err(
                    TemplateError::Budget(format!("more than {} MiB of memory", memory_cap >> 20)),
                ),
                status => Err(TemplateError::Process(format!(
                    "the chat template renderer crashed ({})",
                    status.map_or_else(|err| format!("status unknown: {err}"), |s| s.to_string())
                ))),
            },
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.stop();
                Err(TemplateError::Budget(format!(
                    "more than {} s",
                    RENDER_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Kills and reaps the renderer (one that has already ended is only reaped).
    fn stop(&mut self) -> std::io::Result<ExitStatus> {
        self.broken = true;
        let _ = self.child.kill();
        self.child.wait()
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        // Closing stdin ends the renderer's loop; kill in case it is mid-render.
        if !self.broken {
            let _ = self.stop();
        }
    }
}
