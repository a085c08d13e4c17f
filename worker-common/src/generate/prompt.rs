//! From a request's `prompt` (and `raw` flag) to the token ids the model sees.

use crate::gguf::Gguf;
use crate::tokenizer::render_process::TemplateProcess;
use crate::tokenizer::template::{ChatMessage, ChatTemplate, TemplateError};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Metadata key of the chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Why a prompt could not be turned into tokens.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The chat template failed to render the message.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The tokenizer failed (only `tokenizer.json` tokenizers can).
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A conversation to continue does not end with an assistant message, or the template does
    /// not write that message's text as given.
    #[error(
        "the chat template does not write the final assistant message's text as given, so the reply cannot continue it"
    )]
    NotContinuable,
    /// A conversation was sent to a model without a chat template.
    #[error(
        "the model has no chat template (tokenizer.chat_template), so it cannot render a conversation; send a text prompt instead"
    )]
    NoTemplate,
}

/// Marks where a continued message's text ends in its rendering (control characters no
/// template writes).
const CONTINUE_MARK: &str = "\u{1f}llorch:continue\u{1f}";

/// Renders a short conversation once at load, so that a template that cannot finish within its
/// budget refuses the model instead of failing every request. Other render errors (a template
/// that refuses a system message, say) are left to the requests they concern.
fn probe(template: &Renderer) -> Result<(), TemplateError> {
    let conversation = [
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "Hello!"),
        ChatMessage::new("assistant", "Hi. How can I help?"),
        ChatMessage::new("user", "Write a haiku about autumn."),
    ];
    match template.render_prompt(&conversation, None, true, false, false) {
        Err(err @ (TemplateError::Budget(_) | TemplateError::Process(_))) => Err(err),
        _ => Ok(()),
    }
}

/// Where a model's chat template renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateRendering {
    /// In a renderer process with a heap cap and a deadline
    /// ([`crate::tokenizer::render_process`]): what a worker does with model files from anywhere.
    /// The binary must call `serve_if_renderer` first in `main` and install `BudgetAllocator`.
    Isolated,
    /// In this process, under fuel and output budgets only: for tests and tools that load
    /// known model files (a template that grows a value without bound can exhaust memory).
    InProcess,
}

/// A compiled chat template, in this process or in a renderer process.
#[derive(Debug)]
enum Renderer {
    InProcess(ChatTemplate),
    Isolated(TemplateProcess),
}

impl Renderer {
    fn render_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<String, TemplateError> {
        match self {
            Renderer::InProcess(template) => {
                template.render_prompt(messages, tools, add_generation_prompt, add_bos, add_eos)
            }
            Renderer::Isolated(process) => {
                process.render_prompt(messages, tools, add_generation_prompt, add_bos, add_eos)
            }
        }
    }
}

/// Renders and tokenizes prompts for one model.
#[derive(Debug)]
pub struct PromptFormatter {
    template: Option<Renderer>,
    /// The template's source (what it renders, e.g. how it writes tool calls, is read there).
    source: Option<String>,
}

impl PromptFormatter {
    /// Compiles the model's chat template, when it has one, to render where `rendering` says.
    pub fn from_model<B: AsRef<[u8]>>(
        gguf: &Gguf<B>,
        tokenizer: &Tokenizer,
        rendering: TemplateRendering,
    ) -> Result<Self, TemplateError> {
        match gguf.optional::<&str>(CHAT_TEMPLATE_KEY) {
            Ok(Some(source)) => Self::from_template(source, tokenizer, rendering),
            _ => Ok(Self::without_template()),
        }
    }

    /// Compiles the chat template `source` for `tokenizer`'s special tokens.
    pub fn from_template(
        source: &str,
        tokenizer: &Tokenizer,
        rendering: TemplateRendering,
    ) -> Result<Self, TemplateError> {
        let vocab = tokenizer.vocab();
        let text = |id: Option<u32>| {
            id.and_then(|id| vocab.text(id))
                .unwrap_or_default()
                .to_owned()
        };
        let special = vocab.special();
        let (bos, eos) = (text(special.bos), text(special.eos));
        let template = match rendering {
            TemplateRendering::Isolated => {
                Renderer::Isolated(TemplateProcess::start(source, &bos, &eos)?)
            }
            TemplateRendering::InProcess => {
                Renderer::InProcess(ChatTemplate::new(source, &bos, &eos)?)
            }
        };
        probe(&template)?;
        Ok(Self {
            template: Some(template),
            source: Some(source.to_owned()),
        })
    }

    /// A formatter for a model without a chat template: prompts are tokenized as they are.
    pub fn without_template() -> Self {
        Self {
            template: None,
            source: None,
        }
    }

    /// The chat template's source, when the model has one.
    pub fn template_source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Whether the model has a chat template (so non-raw prompts are rendered).
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The token ids of `prompt`.
    ///
    /// Unless `raw`, a model with a chat template gets the prompt as one user message followed
    /// by the assistant's generation prompt. Either way BOS is added as the vocabulary asks and
    /// special-token text is parsed, as llama.cpp's server does for completions.
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        prompt: &str,
        raw: bool,
    ) -> Result<Vec<u32>, PromptError> {
        if raw || self.template.is_none() {
            return Ok(tokenizer.encode(prompt, true, true)?);
        }
        self.tokenize_chat(tokenizer, &[ChatMessage::new("user", prompt)], None)
    }

    /// The token ids of a conversation (with `tools`, a JSON array's text, for templates that
    /// render tool lists) rendered with the chat template, ending with the assistant's
    /// generation prompt; [`PromptError::NoTemplate`] for a model without one.
    pub fn tokenize_chat(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&str>,
    ) -> Result<Vec<u32>, PromptError> {
        let template = self.template.as_ref().ok_or(PromptError::NoTemplate)?;
        let vocab = tokenizer.vocab();
        let (add_bos, add_eos) = (vocab.add_bos(), vocab.add_eos());
        let text = template.render_prompt(messages, tools, true, add_bos, add_eos)?;
        Ok(tokenizer.encode(&text, true, true)?)
    }

    /// The token ids of a conversation whose last message, the assistant's, the reply
    /// continues (a prefill): rendered without the generation prompt, with the text cut where
    /// that message's text ends (the template's end-of-turn markup after it dropped), as
    /// llama.cpp and Hugging Face continue a final message. [`PromptError::NotContinuable`]
    /// when the last message is not the assistant's or the template does not write its text.
    pub fn tokenize_continuation(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&str>,
    ) -> Result<Vec<u32>, PromptError> {
        let template = self.template.as_ref().ok_or(PromptError::NoTemplate)?;
        let mut marked = messages.to_vec();
        let last = marked
            .last_mut()
            .filter(|message| message.role == "assistant")
            .ok_or(PromptError::NotContinuable)?;
        last.content.push_str(CONTINUE_MARK);
        let add_bos = tokenizer.vocab().add_bos();
        let text = template.render_prompt(&marked, tools, false, add_bos, false)?;
        let end = text
            .rfind(CONTINUE_MARK)
            .ok_or(PromptError::NotContinuable)?;
        Ok(tokenizer.encode(&text[..end], true, true)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tiny_tokenizer;

    /// `a<content><|im_end|>` per message, `c` as the generation prompt (tiny-vocabulary text).
    const SOURCE: &str = "{% for m in messages %}a{{ m.content }}<|im_end|>{% endfor %}{% if add_generation_prompt %}c{% endif %}";

    fn formatter(source: &str) -> PromptFormatter {
        let rendering = TemplateRendering::InProcess;
        PromptFormatter::from_template(source, &tiny_tokenizer(), rendering).unwrap()
    }

    #[test]
    fn a_continued_message_is_cut_where_its_text_ends() {
        let tokenizer = tiny_tokenizer();
        let messages = [
            ChatMessage::new("user", "b"),
            ChatMessage::new("assistant", "x"),
        ];
        let formatter = formatter(SOURCE);
        let chat = formatter
            .tokenize_chat(&tokenizer, &messages, None)
            .unwrap();
        assert_eq!(chat, [1, 2, 0, 1, 7, 0, 3], "ab<|im_end|>ax<|im_end|>c");
        let continued = formatter
            .tokenize_continuation(&tokenizer, &messages, None)
            .unwrap();
        assert_eq!(
            continued,
            [1, 2, 0, 1, 7],
            "ab<|im_end|>ax: the turn left open"
        );
    }

    #[test]
    fn only_a_final_assistant_message_written_as_given_can_be_continued() {
        let tokenizer = tiny_tokenizer();
        let user_last = [ChatMessage::new("user", "b")];
        let continued = formatter(SOURCE).tokenize_continuation(&tokenizer, &user_last, None);
        assert!(matches!(continued, Err(PromptError::NotContinuable)));
        let roles_only = formatter("{% for m in messages %}a{% endfor %}");
        let messages = [
            ChatMessage::new("user", "b"),
            ChatMessage::new("assistant", "x"),
        ];
        let dropped = roles_only.tokenize_continuation(&tokenizer, &messages, None);
        assert!(matches!(dropped, Err(PromptError::NotContinuable)));
    }
}
