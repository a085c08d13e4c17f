//! The pipe protocol between a worker and its renderer process: length-prefixed frames, one
//! request answered by one reply. Strings are a little-endian `u32` byte count and UTF-8 bytes;
//! flags are one byte each.

use std::io::{self, Read, Write};

use crate::tokenizer::template::{ChatMessage, Line, TemplateError};

/// Longest string a frame may carry: a reply holds at most the render's output cap, a request a
/// prompt of the contract's size; anything longer is a broken pipe, not a message.
const MAX_STRING_BYTES: usize = 64 << 20;

/// What the worker asks of the renderer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Request {
    /// Compile `source` with these BOS/EOS texts; later renders use it.
    Load {
        source: String,
        bos_token: String,
        eos_token: String,
    },
    /// [`crate::tokenizer::template::ChatTemplate::render_prompt`] with these arguments.
    Render {
        messages: Vec<ChatMessage>,
        /// The tools' JSON text; empty for none.
        tools: String,
        add_generation_prompt: bool,
        add_bos: bool,
        add_eos: bool,
    },
}

/// The renderer's answer: the rendered text (empty for `Load`) or why it failed.
pub(super) type Reply = Result<String, TemplateError>;

const LOAD: u8 = b'L';
const RENDER: u8 = b'R';
const OK: u8 = b'O';

/// Writes one request (not flushed).
pub(super) fn write_request(out: &mut impl Write, request: &Request) -> io::Result<()> {
    match request {
        Request::Load {
            source,
            bos_token,
            eos_token,
        } => {
            out.write_all(&[LOAD])?;
            for text in [source, bos_token, eos_token] {
                write_str(out, text)?;
            }
        }
        Request::Render {
            messages,
            tools,
            add_generation_prompt,
            add_bos,
            add_eos,
        } => {
            out.write_all(&[RENDER, *add_generation_prompt as u8, *add_bos as u8])?;
            out.write_all(&[*add_eos as u8])?;
            write_str(out, tools)?;
            write_u32(out, len_u32(messages.len())?)?;
            for message in messages {
                write_str(out, &message.role)?;
                write_str(out, &message.content)?;
                write_str(out, message.extra.as_deref().unwrap_or_default())?;
            }
        }
    }
    Ok(())
}

/// Reads one request; `None` when the worker closed the pipe between requests.
pub(super) fn read_request(input: &mut impl Read) -> io::Result<Option<Request>> {
    let mut tag = [0u8; 1];
    if input.read(&mut tag)? == 0 {
        return Ok(None);
    }
    let request = match tag[0] {
        LOAD => Request::Load {
            source: read_str(input)?,
            bos_token: read_str(input)?,
            eos_token: read_str(input)?,
        },
        RENDER => {
            let [add_generation_prompt, add_bos, add_eos] = read_array::<3>(input)?.map(|b| b != 0);
            let tools = read_str(input)?;
            let count = read_u32(input)?;
            let mut messages = Vec::new();
            for _ in 0..count {
                let role = read_str(input)?;
                let content = read_str(input)?;
                let extra = read_str(input)?;
                messages.push(ChatMessage {
                    extra: (!extra.is_empty()).then_some(extra),
                    ..ChatMessage::new(role, content)
                });
            }
            Request::Render {
                messages,
                tools,
                add_generation_prompt,
                add_bos,
                add_eos,
            }
        }
        other => return Err(invalid(format!("unknown request tag {other:#04x}"))),
    };
    Ok(Some(request))
}

/// Writes one reply (not flushed).
pub(super) fn write_reply(out: &mut impl Write, reply: &Reply) -> io::Result<()> {
    let (tag, line, text) = match reply {
        Ok(text) => (OK, None, text.as_str()),
        Err(TemplateError::Syntax { line, detail }) => (b'S', line.0, detail.as_str()),
        Err(TemplateError::Raised(message)) => (b'X', None, message.as_str()),
        Err(TemplateError::Budget(what)) => (b'B', None, what.as_str()),
        Err(TemplateError::Render { line, detail }) => (b'E', line.0, detail.as_str()),
        Err(TemplateError::Process(what)) => (b'P', None, what.as_str()),
    };
    out.write_all(&[tag])?;
    write_u32(
        out,
        line.map_or(u32::MAX, |line| line.min(u32::MAX as usize - 1) as u32),
    )?;
    write_str(out, text)
}

/// Reads one reply.
pub(super) fn read_reply(input: &mut impl Read) -> io::Result<Reply> {
    let [tag] = read_array::<1>(input)?;
    let line = Line(match read_u32(input)? {
        u32::MAX => None,
        line => Some(line as usize),
    });
    let text = read_str(input)?;
    Ok(match tag {
        OK => Ok(text),
        b'S' => Err(TemplateError::Syntax { line, detail: text }),
        b'X' => Err(TemplateError::Raised(text)),
        b'B' => Err(TemplateError::Budget(text)),
        b'E' => Err(TemplateError::Render { line, detail: text }),
        b'P' => Err(TemplateError::Process(text)),
        other => return Err(invalid(format!("unknown reply tag {other:#04x}"))),
    })
}

fn write_u32(out: &mut impl Write, value: u32) -> io::Result<()> {
    out.write_all(&value.to_le_bytes())
}

fn write_str(out: &mut impl Write, text: &str) -> io::Result<()> {
    write_u32(out, len_u32(text.len())?)?;
    out.write_all(text.as_bytes())
}

fn len_u32(len: usize) -> io::Result<u32> {
    match u32::try_from(len) {
        Ok(len) if len as usize <= MAX_STRING_BYTES => Ok(len),
        _ => Err(invalid(format!(
            "{len} is over the frame limit of {MAX_STRING_BYTES}"
        ))),
    }
}

fn read_array<const N: usize>(input: &mut impl Read) -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    input.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn read_u32(input: &mut impl Read) -> io::Result<u32> {
    Ok(u32::from_le_bytes(read_array::<4>(input)?))
}

fn read_str(input: &mut impl Read) -> io::Result<String> {
    let len = len_u32(read_u32(input)? as usize)? as usize;
    let mut bytes = Vec::new();
    input.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    String::from_utf8(bytes).map_err(|err| invalid(format!("a string is not UTF-8: {err}")))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_round_trip(request: Request) {
        let mut bytes = Vec::new();
        write_request(&mut bytes, &request).unwrap();
        let mut input = bytes.as_slice();
        assert_eq!(read_request(&mut input).unwrap(), Some(request));
        assert_eq!(read_request(&mut input).unwrap(), None, "nothing left over");
    }

    #[test]
    fn requests_round_trip() {
        request_round_trip(Request::Load {
            source: "{{ messages[0]['content'] }} é".into(),
            bos_token: "<s>".into(),
            eos_token: String::new(),
        });
        let mut extra = serde_json::Map::new();
        extra.insert("name".into(), "f".into());
        request_round_trip(Request::Render {
            messages: vec![
                ChatMessage::new("user", "hi 🦀"),
                ChatMessage::new("", ""),
                ChatMessage::with_extra("tool", "22", extra),
            ],
            tools: "[{\"type\": \"function\"}]".into(),
            add_generation_prompt: true,
            add_bos: false,
            add_eos: true,
        });
    }

    #[test]
    fn replies_round_trip() {
        let replies: Vec<Reply> = vec![
            Ok("text\n".into()),
            Err(TemplateError::Syntax {
                line: Line(Some(3)),
                detail: "unexpected end".into(),
            }),
            Err(TemplateError::Raised("no system role".into())),
            Err(TemplateError::Budget("more than 5 instructions".into())),
            Err(TemplateError::Render {
                line: Line(None),
                detail: "unknown filter".into(),
            }),
            Err(TemplateError::Process("it ended".into())),
        ];
        for reply in replies {
            let mut bytes = Vec::new();
            write_reply(&mut bytes, &reply).unwrap();
            let back = read_reply(&mut bytes.as_slice()).unwrap();
            assert_eq!(format!("{back:?}"), format!("{reply:?}"));
        }
    }

    #[test]
    fn a_cut_or_garbled_frame_is_an_error_not_a_panic() {
        let mut bytes = Vec::new();
        write_reply(&mut bytes, &Ok("hello".into())).unwrap();
        for cut in 0..bytes.len() {
            assert!(read_reply(&mut &bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(read_request(&mut &b"Z"[..]).is_err());
        let huge = [&[LOAD][..], &u32::MAX.to_le_bytes()].concat();
        assert!(read_request(&mut huge.as_slice()).is_err());
    }
}
