//! A capture's iWARP frames as an independent dissector (Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap`, through
//! [`crate::tshark`]) decodes them, each classified by the dissector's fields: MPA Request, Reply (accept or
//! reject), RTR (RFC 6581 §9: the zero-length Write, Read Request or Send of peer-to-peer mode), Terminate,
//! or a data FPDU. Nothing is inferred from a frame's summary text. And the frames the dissectors call
//! malformed.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// What one frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IwarpKind {
    Request,
    Reply {
        reject: bool,
    },
    /// The ready-to-receive FPDU: a zero-length RDMA Write (STag 0), zero-size Read Request, or zero-length
    /// Send.
    Rtr,
    Terminate,
    /// Any other FPDU (data): its RDMAP opcode.
    Data {
        opcode: u8,
    },
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IwarpFrame {
    pub number: u64,
    pub src: String,
    pub dst: String,
    pub kind: IwarpKind,
    /// tshark's summary line, for people.
    pub info: String,
}

/// The fields [`iwarp_frames`] asks for, in column order.
const FIELDS: [&str; 13] = [
    "frame.number",
    "ip.src",
    "tcp.srcport",
    "ip.dst",
    "tcp.dstport",
    "iwarp_mpa.key.req",
    "iwarp_mpa.key.rep",
    "iwarp_mpa.rej_flag",
    "iwarp_rdma.opcode",
    "iwarp_mpa.ulpdulength",
    "iwarp_ddp.stag",
    "iwarp_rdma.rdmardsz",
    "_ws.col.Info",
];

/// DDP header lengths with the RDMAP control byte (RFC 5041 §4.2-4.3) and the Read Request header
/// (RFC 5040 §4.4): the ULPDU length of a zero-length message.
const TAGGED_HDR: u64 = 14;
const UNTAGGED_HDR: u64 = 18;
const READ_REQUEST_HDR: u64 = 28;

/// A tshark number field: decimal, or hexadecimal with `0x`.
pub fn number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn flag(s: &str) -> Option<bool> {
    match s.trim() {
        "1" | "True" | "true" => Some(true),
        "0" | "False" | "false" | "" => Some(false),
        _ => None,
    }
}

/// Classifies one frame from its [`FIELDS`] values (after the five address columns): `None` when the
/// fields do not make one known kind (several FPDUs in one frame, or a field that does not parse).
pub fn classify(
    key_req: &str,
    key_rep: &str,
    rej_flag: &str,
    opcode: &str,
    ulpdu_len: &str,
    stag: &str,
    read_size: &str,
) -> Option<IwarpKind> {
    let several = |s: &str| s.contains(',');
    if [opcode, ulpdu_len, stag, read_size].iter().any(|s| several(s)) {
        return None;
    }
    match (!key_req.is_empty(), !key_rep.is_empty(), opcode.is_empty()) {
        (true, false, true) => Some(IwarpKind::Request),
        (false, true, true) => Some(IwarpKind::Reply {
            reject: flag(rej_flag)?,
        }),
        (false, false, false) => {
            let op = u8::try_from(number(opcode)?).ok()?;
            let len = number(ulpdu_len)?;
            let rtr = match op {
                0 => len == TAGGED_HDR && number(stag)? == 0,
                1 => len == UNTAGGED_HDR + READ_REQUEST_HDR && number(read_size)? == 0,
                3 => len == UNTAGGED_HDR,
                _ => false,
            };
            Some(match op {
                _ if rtr => IwarpKind::Rtr,
                7 => IwarpKind::Terminate,
                opcode => IwarpKind::Data { opcode },
            })
        }
        _ => None,
    }
}

/// Every frame of `pcap` the iWARP dissectors decode, classified; a frame that cannot be classified is an
/// error (naming it), and so is a tshark that fails (with its stderr).
pub fn iwarp_frames(pcap: &Path) -> Result<Vec<IwarpFrame>> {
    let text = fields(pcap, "iwarp_mpa or iwarp_ddp_rdmap", &FIELDS, '\t')?;
    let mut frames = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != FIELDS.len() {
            bail!(
                "tshark printed {} fields, not {}: {line:?}",
                f.len(),
                FIELDS.len()
            );
        }
        let kind = classify(f[5], f[6], f[7], f[8], f[9], f[10], f[11])
            .with_context(|| format!("frame {} is no iWARP frame this reader knows: {line:?}", f[0]))?;
        frames.push(IwarpFrame {
            number: number(f[0]).with_context(|| format!("frame number in {line:?}"))?,
            src: format!("{}:{}", f[1], f[2]),
            dst: format!("{}:{}", f[3], f[4]),
            kind,
            info: f[12].to_owned(),
        });
    }
    Ok(frames)
}

/// `fields` of every frame of `pcap` that matches `filter`, one line per frame, the fields separated by
/// `separator`, every occurrence of a field (several FPDUs in one frame) joined by `,`.
pub fn fields(pcap: &Path, filter: &str, fields: &[&str], separator: char) -> Result<String> {
    let separator = format!("separator={separator}");
    let mut args = vec!["-Y", filter, "-T", "fields", "-E", &separator];
    args.extend(["-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in fields {
        args.extend(["-e", f]);
    }
    crate::tshark(pcap, &args)
}

/// The frames of `pcap` any dissector calls malformed.
pub fn malformed_frames(pcap: &Path) -> Result<Vec<u64>> {
    frame_numbers(pcap, "_ws.malformed")
}

/// [`malformed_frames`], and the frames with an MPA length the dissector cannot account for.
pub fn malformed_or_bad_length_frames(pcap: &Path) -> Result<Vec<u64>> {
    frame_numbers(pcap, "_ws.malformed || iwarp_mpa.bad_length")
}

/// The numbers of the frames of `pcap` that match `filter`.
fn frame_numbers(pcap: &Path, filter: &str) -> Result<Vec<u64>> {
    crate::tshark(pcap, &["-Y", filter, "-T", "fields", "-e", "frame.number"])?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| number(l).with_context(|| format!("frame number {l:?}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_dissector_fields() {
        let c = |req, rep, rej, op, len, stag, size| classify(req, rep, rej, op, len, stag, size);
        assert_eq!(c("4d5041", "", "", "", "", "", ""), Some(IwarpKind::Request));
        assert_eq!(
            c("", "4d5041", "False", "", "", "", ""),
            Some(IwarpKind::Reply { reject: false })
        );
        assert_eq!(
            c("", "4d5041", "True", "", "", "", ""),
            Some(IwarpKind::Reply { reject: true })
        );
        // The three RTRs (RFC 6581 §9).
        assert_eq!(
            c("", "", "", "0x00", "14", "0x00000000", ""),
            Some(IwarpKind::Rtr)
        );
        assert_eq!(c("", "", "", "1", "46", "", "0"), Some(IwarpKind::Rtr));
        assert_eq!(c("", "", "", "3", "18", "", ""), Some(IwarpKind::Rtr));
        // Not RTRs: payload, a non-zero STag, a non-zero Read size.
        assert_eq!(
            c("", "", "", "3", "118", "", ""),
            Some(IwarpKind::Data { opcode: 3 })
        );
        assert_eq!(
            c("", "", "", "0", "14", "0x100", ""),
            Some(IwarpKind::Data { opcode: 0 })
        );
        assert_eq!(
            c("", "", "", "1", "46", "", "4096"),
            Some(IwarpKind::Data { opcode: 1 })
        );
        assert_eq!(c("", "", "", "7", "46", "", ""), Some(IwarpKind::Terminate));
        // What no kind fits: both keys, none at all, several FPDUs, unparsable fields.
        assert_eq!(c("4d", "4d", "", "", "", "", ""), None);
        assert_eq!(c("", "", "", "", "", "", ""), None);
        assert_eq!(c("", "", "", "3,3", "18,18", "", ""), None);
        assert_eq!(c("", "", "", "x", "18", "", ""), None);
        assert_eq!(c("", "4d", "maybe", "", "", "", ""), None);
    }
}
