//! A shard's documents, read a chunk at a time, so a large input file never sits in memory whole.
//!
//! - **JSONL** is read in ranged requests of [`BLOCK_BYTES`], through a gzip or zstd decoder
//!   where its name ends in `.gz`, `.zst` or `.zstd`; each line is a document. A line
//!   longer than `max_doc_bytes` is a `too_large` reject whose bytes past its first ones are
//!   skipped as they come, never held (a single 10 GB line costs a block, not 10 GB).
//! - **Parquet** is read a row group at a time: the footer with a ranged request from the end,
//!   then each row group's column chunks in one ranged request, decoded in record batches of
//!   `chunk_docs` rows. A row group is Parquet's unit of reading, so it is held whole, compressed
//!   (pyarrow writes row groups of up to 1 Mi rows; a file written as one row group is held once,
//!   compressed, where before it was held compressed, as JSON values and as documents at once).
//! - **Text** files are documents themselves: a shard's files are read together, except a file
//!   over `max_doc_bytes` (its size from the listing), of which only the first bytes are read
//!   for its reject's preview.
//!
//! Each chunk goes to `emit` as soon as it holds `chunk_docs` documents or [`CHUNK_BYTES`] of
//! input; `emit` returns `false` to stop reading (the job stopped taking them).

use std::cell::RefCell;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::{Buf, Bytes};
use object_store::path::Path;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use crate::config::{DatasetSource, InputFormat, ValueFormat};
use crate::error::{FormatError, InputProblem, PipelineError};
use crate::record::{decode, too_large, Input, Lineage, PREVIEW_BYTES};
use crate::shard::{Codec, Shard};
use crate::store::Location;

/// Bytes of a JSONL file a ranged request reads.
pub const BLOCK_BYTES: u64 = 8 << 20;

/// Bytes a part of a JSONL file reads past its end at first, for its last line.
const PAST_BYTES: u64 = 64 << 10;

/// Bytes of (decompressed) JSONL cut into lines at a time.
const READ_BYTES: usize = 1 << 20;

/// Bytes of input past which a chunk goes out with fewer than `chunk_docs` documents (large
/// documents: rows with many or long columns).
pub const CHUNK_BYTES: usize = 4 << 20;

/// Bytes read from a Parquet file's end first, for its footer (a longer footer is read again
/// at its length).
const FOOTER_GUESS: u64 = 64 << 10;

/// A Parquet file's last bytes: the footer's length and the magic number.
const FOOTER_BYTES: u64 = 8;

/// Where documents go, `chunk_docs` (or [`CHUNK_BYTES`]) at a time.
pub(super) struct Chunks<'a> {
    pub chunk_docs: usize,
    pub emit: &'a mut dyn FnMut(Vec<Input>) -> bool,
    buf: Vec<Input>,
    /// Input bytes of the documents in `buf`.
    bytes: usize,
    stopped: bool,
}

impl<'a> Chunks<'a> {
    pub fn new(chunk_docs: usize, emit: &'a mut dyn FnMut(Vec<Input>) -> bool) -> Self {
        Self {
            chunk_docs: chunk_docs.max(1),
            emit,
            buf: Vec::new(),
            bytes: 0,
            stopped: false,
        }
    }

    /// Adds one document, read from `raw` bytes of input; false once reading should stop.
    fn push(&mut self, input: Input, raw: usize) -> bool {
        self.buf.push(input);
        self.bytes += raw;
        if self.buf.len() >= self.chunk_docs || self.bytes >= CHUNK_BYTES {
            self.flush();
        }
        !self.stopped
    }

    /// Hands over what is held; false once reading should stop.
    pub fn flush(&mut self) -> bool {
        if !self.buf.is_empty() && !self.stopped {
            let chunk = std::mem::take(&mut self.buf);
            self.bytes = 0;
            self.stopped = !(self.emit)(chunk);
        }
        !self.stopped
    }
}

/// Where a job's shards are and how they are read.
#[derive(Clone, Copy)]
pub(super) struct Reading<'a> {
    pub input: &'a Location,
    pub src: &'a DatasetSource,
    pub max_doc_bytes: usize,
    /// Bytes of JSONL a ranged request reads ([`BLOCK_BYTES`]; less in tests).
    pub block: u64,
}

/// Reads a shard into `out`, in order. A file that cannot be read at all is an error for the
/// whole job: nothing of it is skipped silently. Returns false when `out` stopped taking
/// documents.
pub(super) fn read_shard(
    r: Reading<'_>,
    shard: &Shard,
    out: &mut Chunks<'_>,
) -> Result<bool, PipelineError> {
    let Reading {
        input,
        src,
        max_doc_bytes,
        block,
    } = r;
    if src.format == InputFormat::Text {
        return read_text(r, shard, out);
    }
    // A part reads what starts in its bytes; a whole file, everything.
    let bytes = shard.part.as_ref().map_or(0..u64::MAX, |p| p.bytes.clone());
    for (path, &size) in shard.files.iter().zip(&shard.sizes) {
        let source = source_name(input, path);
        let file = File {
            input,
            path,
            size,
            source: &source,
        };
        let going = match src.format {
            InputFormat::Jsonl => read_jsonl(&file, src, max_doc_bytes, block, bytes.clone(), out)?,
            InputFormat::Parquet => read_parquet(&file, src, max_doc_bytes, bytes.clone(), out)?,
            InputFormat::Text => unreachable!("text shards are read above"),
        };
        if !going {
            return Ok(false);
        }
    }
    Ok(out.flush())
}

/// The URL a document's lineage names.
fn source_name(input: &Location, path: &Path) -> String {
    format!(
        "{}/{}",
        input.url.trim_end_matches('/'),
        input.relative(path)
    )
}

/// One input object.
struct File<'a> {
    input: &'a Location,
    path: &'a Path,
    size: u64,
    source: &'a str,
}

impl File<'_> {
    fn read(&self, range: Range<u64>) -> Result<Bytes, PipelineError> {
        self.input.read_range(self.path, range)
    }

    fn bad(&self, e: impl Into<FormatError>) -> PipelineError {
        PipelineError::Input {
            location: self.source.to_string(),
            source: InputProblem::Format(e.into()),
        }
    }
}

fn read_text(r: Reading<'_>, shard: &Shard, out: &mut Chunks<'_>) -> Result<bool, PipelineError> {
    let Reading {
        input,
        src,
        max_doc_bytes,
        ..
    } = r;
    // Many small files: read at once, not one round trip after another. A file over the limit
    // is a reject: only its first bytes are read.
    let small: Vec<Path> = shard
        .files
        .iter()
        .zip(&shard.sizes)
        .filter(|(_, &size)| size as usize <= max_doc_bytes)
        .map(|(p, _)| p.clone())
        .collect();
    let mut read = input.read_all(&small)?.into_iter();
    for (fi, (path, &size)) in shard.files.iter().zip(&shard.sizes).enumerate() {
        let lineage = Lineage::new(source_name(input, path), None, fi as i64);
        let doc = if size as usize <= max_doc_bytes {
            let bytes = read.next().expect("one read per small file");
            decode(
                &bytes,
                ValueFormat::Text,
                &src.fields,
                max_doc_bytes,
                lineage,
            )
        } else {
            let start = input.read_range(path, 0..size.min(PREVIEW_BYTES as u64))?;
            too_large(&start, size as usize, max_doc_bytes, lineage)
        };
        if !out.push(doc, size.min(max_doc_bytes as u64) as usize) {
            return Ok(false);
        }
    }
    Ok(out.flush())
}

/// A line being read: its bytes so far, or (past the limit) its first bytes, its length and
/// whether its last byte so far is a '\r' (not counted when the line ends there).
enum Line {
    Held(Vec<u8>),
    Over {
        start: Vec<u8>,
        bytes: usize,
        cr: bool,
    },
}

/// Reads the lines of a JSONL file that start in `bytes` (of the decompressed stream): a line
/// that starts in them is read to its end, and a range that starts inside a line skips to the
/// next. Each line's lineage offset is its first byte's offset.
fn read_jsonl(
    file: &File<'_>,
    src: &DatasetSource,
    max_doc_bytes: usize,
    block: u64,
    bytes: Range<u64>,
    out: &mut Chunks<'_>,
) -> Result<bool, PipelineError> {
    let mut line = Line::Held(Vec::new());
    // Ends the line in `line` (its '\n' not included), which starts at byte `at`.
    let mut finish = |line: Line, at: u64| -> bool {
        let lineage = Lineage::new(file.source, None, at as i64);
        let raw = match &line {
            Line::Held(bytes) => bytes.len(),
            Line::Over { start, .. } => start.len(),
        };
        let input = match line {
            Line::Held(bytes) => {
                // Lines split on bytes, so one line of bad UTF-8 is one reject, not a lost file.
                let bytes = bytes.strip_suffix(b"\r").unwrap_or(&bytes);
                decode(
                    bytes,
                    ValueFormat::Json,
                    &src.fields,
                    max_doc_bytes,
                    lineage,
                )
            }
            Line::Over {
                mut start,
                bytes,
                cr,
            } => {
                if cr && start.len() == bytes {
                    start.pop();
                }
                too_large(&start, bytes - usize::from(cr), max_doc_bytes, lineage)
            }
        };
        out.push(input, raw)
    };
    // A line starts at byte 0 or after a '\n': a range from byte b > 0 reads from b - 1 and
    // skips to its first '\n', so a line that starts exactly at b is this range's.
    let mut skipping = bytes.start > 0;
    let mut pos = bytes.start.saturating_sub(1);
    let mut line_start = pos;
    let failed = RefCell::new(None);
    let ranged = Ranged {
        file,
        at: pos,
        block,
        stop: bytes.end,
        past: PAST_BYTES,
        held: Bytes::new(),
        failed: &failed,
    };
    let relative = file.input.relative(file.path);
    let codec = Codec::of_jsonl(&relative).map_or(Codec::Plain, |(c, _)| c);
    let mut stream: Box<dyn Read + '_> = match codec {
        Codec::Plain => Box::new(ranged),
        Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(ranged)),
        Codec::Zstd => Box::new(
            zstd::stream::read::Decoder::new(ranged)
                .map_err(|e| file.bad(FormatError::Decompress(e)))?,
        ),
    };
    let mut buf = vec![0; READ_BYTES];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The store's own error where the store failed; else the stream is bad.
            Err(e) => {
                let store = failed.borrow_mut().take();
                return Err(store.unwrap_or_else(|| file.bad(FormatError::Decompress(e))));
            }
        };
        let mut rest: &[u8] = &buf[..n];
        if skipping {
            let Some(cut) = rest.iter().position(|b| *b == b'\n') else {
                pos += n as u64;
                continue;
            };
            skipping = false;
            pos += cut as u64 + 1;
            rest = &rest[cut + 1..];
            line_start = pos;
            if line_start >= bytes.end {
                return Ok(true);
            }
        }
        loop {
            let cut = rest.iter().position(|b| *b == b'\n');
            let part = &rest[..cut.unwrap_or(rest.len())];
            line = match line {
                Line::Held(mut bytes) => {
                    bytes.extend_from_slice(part);
                    // One byte of slack for a '\r' before the '\n'.
                    if bytes.len() > max_doc_bytes + 1 {
                        let total = bytes.len();
                        let cr = bytes.last() == Some(&b'\r');
                        bytes.truncate(PREVIEW_BYTES);
                        bytes.shrink_to_fit();
                        Line::Over {
                            start: bytes,
                            bytes: total,
                            cr,
                        }
                    } else {
                        Line::Held(bytes)
                    }
                }
                Line::Over {
                    mut start,
                    bytes,
                    cr,
                } => {
                    let room = PREVIEW_BYTES.saturating_sub(start.len()).min(part.len());
                    start.extend_from_slice(&part[..room]);
                    Line::Over {
                        start,
                        bytes: bytes + part.len(),
                        cr: part.last().map_or(cr, |b| *b == b'\r'),
                    }
                }
            };
            let Some(cut) = cut else {
                pos += rest.len() as u64;
                break;
            };
            let done = std::mem::replace(&mut line, Line::Held(Vec::new()));
            if !finish(done, line_start) {
                return Ok(false);
            }
            pos += cut as u64 + 1;
            line_start = pos;
            if line_start >= bytes.end {
                return Ok(true);
            }
            rest = &rest[cut + 1..];
        }
    }
    // The last line, where the file does not end with '\n'.
    match &line {
        _ if skipping => Ok(true),
        Line::Held(bytes) if bytes.is_empty() => Ok(true),
        _ => Ok(finish(line, line_start)),
    }
}

/// A file's bytes as a stream, read by ranged requests of `block` bytes as they are asked for,
/// up to `stop`; past it (a part's last line runs on into the next part) by requests of
/// `past` bytes that double up to `block`, so a part reads little of the next one. A store
/// error ends the stream with an I/O error and is kept in `failed`, so the job stops with the
/// store's own error.
struct Ranged<'a> {
    file: &'a File<'a>,
    at: u64,
    block: u64,
    stop: u64,
    past: u64,
    held: Bytes,
    failed: &'a RefCell<Option<PipelineError>>,
}

impl Read for Ranged<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.held.is_empty() && self.at < self.file.size {
            let end = if self.at < self.stop {
                self.at.saturating_add(self.block).min(self.stop)
            } else {
                let end = self.at.saturating_add(self.past);
                self.past = (self.past * 2).min(self.block);
                end
            }
            .min(self.file.size);
            match self.file.read(self.at..end) {
                Ok(bytes) => self.held = bytes,
                Err(e) => {
                    let message = e.to_string();
                    *self.failed.borrow_mut() = Some(e);
                    return Err(std::io::Error::other(message));
                }
            }
            self.at = end;
        }
        let n = buf.len().min(self.held.len());
        buf[..n].copy_from_slice(&self.held[..n]);
        self.held.advance(n);
        Ok(n)
    }
}

/// Bytes of a Parquet file held in memory, a row group's column chunks, at their offsets in the
/// file. The reader asks only for bytes inside them.
struct Span {
    start: u64,
    bytes: Bytes,
    file_len: u64,
}

impl Span {
    fn at(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.start)
            .map(|f| f as usize)
            .filter(|f| f + len <= self.bytes.len())
            .ok_or_else(|| {
                ParquetError::General(format!(
                    "read of {len} bytes at {start} outside the bytes held ({}..{})",
                    self.start,
                    self.start + self.bytes.len() as u64
                ))
            })?;
        Ok(self.bytes.slice(from..from + len))
    }
}

impl Length for Span {
    fn len(&self) -> u64 {
        self.file_len
    }
}

impl ChunkReader for Span {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let held_end = self.start + self.bytes.len() as u64;
        let len = held_end.saturating_sub(start) as usize;
        Ok(self.at(start, len)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.at(start, length)
    }
}

/// Reads the row groups of a Parquet file whose first byte is in `bytes`; each row's lineage
/// offset is its index in the whole file.
fn read_parquet(
    file: &File<'_>,
    src: &DatasetSource,
    max_doc_bytes: usize,
    bytes: Range<u64>,
    out: &mut Chunks<'_>,
) -> Result<bool, PipelineError> {
    let bad = |e: ParquetError| file.bad(e);
    let meta = Arc::new(parquet_footer(|range| file.read(range), file.size, &bad)?);
    let arrow =
        ArrowReaderMetadata::try_new(Arc::clone(&meta), ArrowReaderOptions::new()).map_err(bad)?;
    let mut row: i64 = 0;
    for (g, group) in meta.row_groups().iter().enumerate() {
        let spans = group.columns().iter().map(|c| {
            let (start, len) = c.byte_range();
            start..start + len
        });
        let Some(range) = spans.reduce(|a, b| a.start.min(b.start)..a.end.max(b.end)) else {
            continue;
        };
        if !bytes.contains(&range.start) {
            // Another part's.
            row += group.num_rows();
            continue;
        }
        if range.end > file.size {
            return Err(bad(ParquetError::General(format!(
                "row group {g} ends at byte {}, past the file's {} bytes",
                range.end, file.size
            ))));
        }
        let span = Span {
            start: range.start,
            bytes: file.read(range)?,
            file_len: file.size,
        };
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(span, arrow.clone())
            .with_row_groups(vec![g])
            .with_batch_size(out.chunk_docs)
            .build()
            .map_err(bad)?;
        for batch in reader {
            let batch = batch.map_err(|e| file.bad(e))?;
            for value in json_rows(&batch).map_err(|e| file.bad(e))? {
                let lineage = Lineage::new(file.source, None, row);
                row += 1;
                let raw = serde_json::to_vec(&value).unwrap_or_default();
                let input = decode(&raw, ValueFormat::Json, &src.fields, max_doc_bytes, lineage);
                if !out.push(input, raw.len()) {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// The footer of a Parquet file of `size` bytes, read by ranged requests from its end (`read`):
/// a guess at its length, then exactly what it says it needs. `bad` names the file in errors.
pub(crate) fn parquet_footer(
    read: impl Fn(Range<u64>) -> Result<Bytes, PipelineError>,
    size: u64,
    bad: &dyn Fn(ParquetError) -> PipelineError,
) -> Result<ParquetMetaData, PipelineError> {
    if size < FOOTER_BYTES {
        return Err(bad(ParquetError::EOF(format!(
            "{size} bytes, too short for a Parquet file"
        ))));
    }
    let mut from = size.saturating_sub(FOOTER_GUESS);
    let mut footer = ParquetMetaDataReader::new();
    loop {
        let tail = read(from..size)?;
        match footer.try_parse_sized(&tail, size) {
            Ok(()) => break,
            Err(ParquetError::NeedMoreData(n)) if (n as u64) <= size && from > 0 => {
                from = size - n as u64;
            }
            Err(e) => return Err(bad(e)),
        }
    }
    footer.finish().map_err(bad)
}

/// A record batch's rows as JSON objects (arrow-json's writer, so every Arrow type has one
/// spelling).
fn json_rows(batch: &RecordBatch) -> Result<Vec<serde_json::Value>, FormatError> {
    let mut buf = Vec::new();
    let mut w = arrow_json::ArrayWriter::new(&mut buf);
    w.write(batch)?;
    w.finish()?;
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    Ok(serde_json::from_slice(&buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PipelineConfig, SourceConfig};
    use crate::encode::to_parquet;
    use crate::record::RejectCause;
    use arrow_array::{ArrayRef, StringArray};

    fn source(format: &str) -> DatasetSource {
        let text = format!(
            "name = \"t\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\n\
             format = \"{format}\"\nfields = {{ text = \"text\", id = \"id\" }}\n[prompt]\n\
             template = \"{{{{ text }}}}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n"
        );
        match PipelineConfig::parse(&text, "t.toml", Default::default())
            .unwrap()
            .source
        {
            SourceConfig::Dataset(src) => src,
            _ => unreachable!(),
        }
    }

    fn reading<'a>(
        input: &'a Location,
        src: &'a DatasetSource,
        max_doc_bytes: usize,
        block: u64,
    ) -> Reading<'a> {
        Reading {
            input,
            src,
            max_doc_bytes,
            block,
        }
    }

    /// `bytes` as the one file of a shard in a fresh in-memory store.
    fn one_file(tag: &str, name: &str, bytes: Vec<u8>) -> (Location, Shard) {
        let input = Location::open(&format!("memory://read-{tag}/in")).unwrap();
        let size = bytes.len() as u64;
        input.publish(name, bytes.into()).unwrap();
        let shard = Shard {
            name: "s.parquet".into(),
            files: vec![input.path(name)],
            sizes: vec![size],
            part: None,
        };
        (input, shard)
    }

    /// The shards `shard`'s one file is cut into at `split` bytes, as the listing cuts it.
    fn parts(shard: &Shard, split: u64) -> Vec<Shard> {
        let ranges = crate::shard::split_ranges(shard.sizes[0], split);
        let count = ranges.len();
        ranges
            .into_iter()
            .enumerate()
            .map(|(index, bytes)| Shard {
                part: Some(crate::shard::Part {
                    index,
                    count,
                    bytes,
                }),
                ..shard.clone()
            })
            .collect()
    }

    /// The lines of `file` (split on '\n', without it) with each one's first byte's offset.
    fn lines(file: &[u8]) -> Vec<(i64, &[u8])> {
        let mut at = 0;
        file.split(|b| *b == b'\n')
            .map(|line| {
                let start = at;
                at += line.len() as i64 + 1;
                (start, line)
            })
            .collect()
    }

    /// Every chunk read, with JSONL in requests of `block` bytes.
    fn chunks(
        input: &Location,
        shard: &Shard,
        src: &DatasetSource,
        max: usize,
        block: u64,
        chunk_docs: usize,
    ) -> Vec<Vec<Input>> {
        let mut got = Vec::new();
        let mut emit = |c: Vec<Input>| {
            got.push(c);
            true
        };
        let mut out = Chunks::new(chunk_docs, &mut emit);
        assert!(read_shard(reading(input, src, max, block), shard, &mut out).unwrap());
        got
    }

    /// What a rejects or accepted row would show of an input.
    fn shown(i: &Input) -> String {
        let doc = match &i.doc {
            Ok(d) => format!("doc {:?} {:?}", d.id, d.text),
            Err(c) => format!("{} {}", c.name(), c.detail()),
        };
        format!("{} {:?} {:?} {doc}", i.lineage.offset, i.id, i.preview)
    }

    #[test]
    fn jsonl_read_in_blocks_of_any_size_gives_what_the_whole_file_gives() {
        let src = source("jsonl");
        let max = 48;
        let long = format!("{{\"id\": \"long\", \"text\": \"{}\"}}", "y".repeat(80));
        let mut file: Vec<u8> = Vec::new();
        file.extend_from_slice(b"{\"id\": \"a\", \"text\": \"first\"}\r\n");
        file.extend_from_slice(b"\n"); // an empty line
        file.extend_from_slice(b"{\"id\": \"u\", \"text\": \"caf\xc3\x28\"}\n"); // bad UTF-8
        file.extend_from_slice(long.as_bytes()); // over the limit, across blocks
        file.extend_from_slice(b"\r\n");
        file.extend_from_slice(long.as_bytes());
        file.extend_from_slice(b"\n");
        file.extend_from_slice(&b"x".repeat(max + 1)); // one byte over, no '\r'
        file.extend_from_slice(b"\n");
        file.extend_from_slice(&b"z".repeat(max)); // exactly at the limit with a '\r'
        file.extend_from_slice(b"\r\n");
        file.extend_from_slice(b"{\"id\": \"b\", \"text\": \"last, no newline\"}");
        // The reference: the whole file split on '\n', each line decoded as it is, with its
        // first byte's offset.
        let want: Vec<String> = lines(&file)
            .into_iter()
            .map(|(at, line)| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let lineage = Lineage::new("memory://read-jsonl/in/f.jsonl", None, at);
                shown(&decode(line, ValueFormat::Json, &src.fields, max, lineage))
            })
            .collect();
        assert_eq!(want.len(), 8);
        assert!(
            want[3].contains("too_large") && want[4].contains("too_large"),
            "{want:?}"
        );
        assert!(
            want[5].contains("too_large") && !want[6].contains("too_large"),
            "{want:?}"
        );
        let (input, shard) = one_file("jsonl", "f.jsonl", file.clone());
        for block in [1, 2, 3, 7, 64, file.len() as u64, BLOCK_BYTES] {
            for chunk_docs in [1, 3, 100] {
                let got = chunks(&input, &shard, &src, max, block, chunk_docs);
                assert!(got.iter().all(|c| !c.is_empty() && c.len() <= chunk_docs));
                let got: Vec<String> = got.iter().flatten().map(shown).collect();
                assert_eq!(got, want, "block {block}, chunks of {chunk_docs}");
            }
        }
        // Cut into parts of any size, read in requests of any size, the parts together give
        // every line once, in order: a line that starts in a part is read to its end, past it.
        let len = file.len() as u64;
        for split in [1, 2, 3, 5, 7, 13, 40, len / 3, len - 1, len] {
            for block in [1, 3, 64, BLOCK_BYTES] {
                let shards = parts(&shard, split);
                assert_eq!(shards.len() as u64, len.div_ceil(split));
                let got: Vec<String> = shards
                    .iter()
                    .flat_map(|s| chunks(&input, s, &src, max, block, 3))
                    .flatten()
                    .map(|i| shown(&i))
                    .collect();
                assert_eq!(got, want, "parts of {split} bytes, block {block}");
            }
        }
    }

    #[cfg(feature = "test-support")]
    #[test]
    fn a_part_reads_little_past_its_end() {
        let src = source("jsonl");
        let line = format!("{{\"text\": \"{}\"}}\n", "r".repeat(100));
        let file = line.repeat(20_000).into_bytes();
        let (input, shard) = one_file("past", "f.jsonl", file.clone());
        let store = Arc::new(crate::faults::FaultyStore::new(
            input.store.clone(),
            0,
            false,
        ));
        let input = Location {
            store: store.clone(),
            ..input
        };
        let all = parts(&shard, file.len() as u64 / 4);
        let got = chunks(&input, &all[1], &src, 1000, 256 << 10, 100);
        let read: usize = got.iter().map(Vec::len).sum();
        assert!((4_990..=5_010).contains(&read), "{read} lines");
        let part = all[1].part.as_ref().unwrap().bytes.clone();
        let fetched = store.bytes_read.load(std::sync::atomic::Ordering::SeqCst);
        // One byte before the part (for the line that may start on its first byte), then
        // 64 KiB past its end at most for a line of 115 bytes.
        assert!(
            fetched <= part.end - part.start + 1 + PAST_BYTES,
            "fetched {fetched} for a part of {}",
            part.end - part.start
        );
    }

    /// `bytes` compressed as `codec` writes it: gzip (here in two members, as `cat a.gz b.gz`
    /// makes) or zstd.
    fn compressed(bytes: &[u8], codec: Codec) -> Vec<u8> {
        use std::io::Write;
        match codec {
            Codec::Plain => bytes.to_vec(),
            Codec::Gzip => {
                let (a, b) = bytes.split_at(bytes.len() / 2);
                let mut out = Vec::new();
                for half in [a, b] {
                    let mut e =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(half).unwrap();
                    out.extend(e.finish().unwrap());
                }
                out
            }
            Codec::Zstd => zstd::stream::encode_all(bytes, 3).unwrap(),
        }
    }

    #[test]
    fn compressed_jsonl_reads_as_the_plain_file_does() {
        let src = source("jsonl");
        let plain: String = (0..300)
            .map(|k| format!("{{\"id\": \"{k}\", \"text\": \"document {k}\"}}\n"))
            .collect();
        let (input, shard) = one_file("plain", "f.jsonl", plain.clone().into_bytes());
        let want: Vec<String> = chunks(&input, &shard, &src, 1000, BLOCK_BYTES, 64)
            .iter()
            .flatten()
            .map(|i| shown(i).replace("/read-plain/in/f.jsonl", ""))
            .collect();
        assert_eq!(want.len(), 300);
        for (codec, name) in [
            (Codec::Gzip, "f.jsonl.gz"),
            (Codec::Zstd, "f.ndjson.zst"),
            (Codec::Zstd, "f.json.zstd"),
        ] {
            let tag = format!("{codec:?}-{name}");
            let (input, shard) = one_file(&tag, name, compressed(plain.as_bytes(), codec));
            for block in [1, 7, 100, BLOCK_BYTES] {
                let got: Vec<String> = chunks(&input, &shard, &src, 1000, block, 64)
                    .iter()
                    .flatten()
                    .map(|i| shown(i).replace(&format!("/read-{tag}/in/{name}"), ""))
                    .collect();
                assert_eq!(got, want, "{name}, blocks of {block}");
            }
        }
        // Empty compressed files hold no documents.
        for (codec, name) in [(Codec::Gzip, "e.jsonl.gz"), (Codec::Zstd, "e.jsonl.zst")] {
            let (input, shard) = one_file(&format!("empty-{name}"), name, compressed(b"", codec));
            assert!(
                chunks(&input, &shard, &src, 1000, 64, 8).is_empty(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_corrupt_or_cut_compressed_file_is_an_input_error_naming_it() {
        let src = source("jsonl");
        let text = "{\"text\": \"a\"}\n".repeat(1000);
        for (codec, name) in [
            (Codec::Gzip, "bad.jsonl.gz"),
            (Codec::Zstd, "bad.jsonl.zst"),
        ] {
            let whole = compressed(text.as_bytes(), codec);
            let mut flipped = whole.clone();
            let mid = flipped.len() / 3;
            flipped[mid] ^= 0x5a;
            // Cut inside a gzip member (at half, two equal members would end cleanly).
            let cut = whole[..whole.len() / 2 + 3].to_vec();
            for (how, bytes) in [("cut", cut), ("flipped", flipped)] {
                let (input, shard) = one_file(&format!("{how}-{name}"), name, bytes);
                let mut emit = |_: Vec<Input>| true;
                let mut out = Chunks::new(4, &mut emit);
                let e = read_shard(reading(&input, &src, 1000, 64), &shard, &mut out)
                    .expect_err(&format!("{how} {name}"));
                let msg = e.to_string();
                assert!(
                    matches!(e, PipelineError::Input { .. }) && msg.contains(name),
                    "{how} {name}: {msg}"
                );
            }
        }
    }

    #[test]
    fn a_huge_line_is_a_reject_without_its_bytes_held() {
        let src = source("jsonl");
        let mut file = b"{\"text\": \"".to_vec();
        file.extend(std::iter::repeat_n(b'q', 3 << 20));
        file.extend_from_slice(b"\"}\n{\"text\": \"after\"}\n");
        let (input, shard) = one_file("huge", "f.jsonl", file.clone());
        let got = chunks(&input, &shard, &src, 1 << 20, 64 << 10, 10);
        let got: Vec<&Input> = got.iter().flatten().collect();
        assert_eq!(got.len(), 2);
        match &got[0].doc {
            Err(RejectCause::TooLarge { bytes, limit }) => {
                assert_eq!((*bytes, *limit), ((3 << 20) + 12, 1 << 20))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(got[0].preview.len(), PREVIEW_BYTES);
        assert!(got[0].preview.starts_with("{\"text\": \"qqq"));
        assert_eq!(got[1].doc.as_ref().unwrap().text, "after");
        assert_eq!(got[1].lineage.offset, lines(&file)[1].0);
    }

    #[test]
    fn large_documents_make_chunks_of_fewer_documents() {
        let src = source("jsonl");
        let line = format!("{{\"text\": \"{}\"}}\n", "w".repeat(1 << 20));
        let (input, shard) = one_file("large", "f.jsonl", line.repeat(12).into_bytes());
        let got = chunks(&input, &shard, &src, 2 << 20, BLOCK_BYTES, 100);
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        // A chunk goes out at the line that takes it to CHUNK_BYTES.
        let per_chunk = CHUNK_BYTES.div_ceil(line.len() - 1);
        assert_eq!(sizes, [per_chunk, per_chunk, 12 - 2 * per_chunk]);
    }

    #[test]
    fn reading_stops_when_the_chunks_are_no_longer_taken() {
        let src = source("jsonl");
        let file: String = (0..10)
            .map(|k| format!("{{\"text\": \"d{k}\"}}\n"))
            .collect();
        let (input, shard) = one_file("stop", "f.jsonl", file.into_bytes());
        let mut taken = 0;
        let mut emit = |c: Vec<Input>| {
            taken += c.len();
            false
        };
        let mut out = Chunks::new(3, &mut emit);
        assert!(!read_shard(reading(&input, &src, 1000, 4), &shard, &mut out).unwrap());
        assert_eq!(taken, 3, "one chunk, then nothing more");
    }

    /// A Parquet file of `rows` rows in row groups of `group` rows, with a footer entry of
    /// `footer_pad` bytes (a footer longer than the first guess at its length).
    fn parquet(rows: usize, group: usize, footer_pad: usize) -> (Vec<u8>, Vec<String>) {
        let texts: Vec<String> = (0..rows).map(|k| format!("document {k}")).collect();
        let ids: Vec<String> = (0..rows).map(|k| format!("id{k}")).collect();
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(StringArray::from(ids)) as ArrayRef),
            (
                "text",
                Arc::new(StringArray::from(texts.clone())) as ArrayRef,
            ),
        ])
        .unwrap();
        let meta = [("pad".to_string(), "p".repeat(footer_pad))];
        (to_parquet(&batch, &meta, group, 1).unwrap().to_vec(), texts)
    }

    #[test]
    fn parquet_is_read_a_row_group_at_a_time_in_order() {
        let src = source("parquet");
        for (rows, group, pad, chunk_docs) in [
            (10, 3, 0, 2),
            (10, 10, 0, 4),
            (7, 2, 200_000, 64),
            (0, 5, 0, 8),
        ] {
            let (file, texts) = parquet(rows, group, pad);
            let tag = format!("pq-{rows}-{group}-{pad}");
            let (input, shard) = one_file(&tag, "f.parquet", file);
            let got = chunks(&input, &shard, &src, 1000, BLOCK_BYTES, chunk_docs);
            assert!(got.iter().all(|c| c.len() <= chunk_docs));
            let got: Vec<&Input> = got.iter().flatten().collect();
            let read: Vec<(i64, &str, &str)> = got
                .iter()
                .map(|i| {
                    let d = i.doc.as_ref().unwrap();
                    (i.lineage.offset, d.id.as_str(), d.text.as_str())
                })
                .collect();
            let ids: Vec<String> = (0..rows).map(|k| format!("id{k}")).collect();
            let want: Vec<(i64, &str, &str)> = (0..rows)
                .map(|k| (k as i64, ids[k].as_str(), texts[k].as_str()))
                .collect();
            assert_eq!(
                read, want,
                "{rows} rows in groups of {group}, footer pad {pad}"
            );
        }
    }

    #[test]
    fn the_parts_of_a_parquet_file_hold_its_row_groups_once_with_their_row_numbers() {
        let src = source("parquet");
        let (file, texts) = parquet(40, 3, 0);
        let len = file.len() as u64;
        let (input, shard) = one_file("pq-parts", "f.parquet", file);
        let want: Vec<(i64, String)> = texts
            .iter()
            .enumerate()
            .map(|(k, t)| (k as i64, t.clone()))
            .collect();
        for split in [1, 50, 200, 700, len / 3, len / 2, len] {
            let mut got = Vec::new();
            for part in parts(&shard, split) {
                let rows: Vec<(i64, String)> = chunks(&input, &part, &src, 1000, BLOCK_BYTES, 8)
                    .into_iter()
                    .flatten()
                    .map(|i| (i.lineage.offset, i.doc.unwrap().text))
                    .collect();
                // Whole row groups of 3 rows (the last of 1): a part never cuts one.
                if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                    assert_eq!(first.0 % 3, 0, "parts of {split}: {rows:?}");
                    assert!(
                        last.0 % 3 == 2 || last.0 == 39,
                        "parts of {split}: {rows:?}"
                    );
                }
                got.extend(rows);
            }
            assert_eq!(got, want, "parts of {split} bytes");
        }
    }

    #[test]
    fn a_short_or_cut_parquet_file_is_an_input_error_naming_it() {
        let src = source("parquet");
        let (file, _) = parquet(10, 3, 0);
        for (tag, bytes) in [
            ("empty", Vec::new()),
            ("cut", file[file.len() / 2..].to_vec()),
        ] {
            let (input, shard) = one_file(tag, "bad.parquet", bytes);
            let mut emit = |_: Vec<Input>| true;
            let mut out = Chunks::new(4, &mut emit);
            let e =
                read_shard(reading(&input, &src, 1000, BLOCK_BYTES), &shard, &mut out).unwrap_err();
            assert!(
                matches!(e, PipelineError::Input { .. }) && e.to_string().contains("bad.parquet"),
                "{tag}: {e}"
            );
        }
    }

    #[test]
    fn a_text_file_over_the_limit_is_a_reject_with_its_first_bytes() {
        let src = source("text");
        let (input, mut shard) = one_file("text", "big.txt", b"b".repeat(5000));
        input.publish("small.txt", b"small"[..].into()).unwrap();
        shard.files.push(input.path("small.txt"));
        shard.sizes.push(5);
        let got = chunks(&input, &shard, &src, 4096, BLOCK_BYTES, 10);
        let got: Vec<&Input> = got.iter().flatten().collect();
        assert!(matches!(
            got[0].doc,
            Err(RejectCause::TooLarge {
                bytes: 5000,
                limit: 4096
            })
        ));
        assert_eq!(got[0].preview, "b".repeat(PREVIEW_BYTES));
        assert_eq!(got[1].doc.as_ref().unwrap().text, "small");
        assert_eq!((got[0].lineage.offset, got[1].lineage.offset), (0, 1));
    }
}
