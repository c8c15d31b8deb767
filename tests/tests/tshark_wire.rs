//! An independent reading of soft-rdma's wire: a pcap of a synthetic conversation written with
//! `soft_rdma_common::wire` (MPA Request/Reply, then one FPDU of every RDMAP kind, with and without CRC) must
//! decode in Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap` dissectors (tshark) with the expected field values,
//! good CRCs, and no expert notes beyond the two Debian's tshark 4.0 emits for every RFC 6581 (Rev 2) frame.

use std::path::{Path, PathBuf};

use soft_rdma::capture::{SampleFrame, sample_capture};
use soft_rdma_common::wire::ddp::Placement;
use soft_rdma_common::wire::fpdu::{FpduRepr, crc32c};

/// Expert notes tshark 4.0 (pre-RFC 6581) raises for MPA Rev 2 frames: expected (docs/iwarp-wire.md §6).
const EXPECTED_REV2_NOTES: [&str; 2] = [
    "Rev field is NOT set to one as required by RFC 5044",
    "Res field is NOT set to zero as required by RFC 5044",
];

fn tshark(pcap: &Path, args: &[&str]) -> String {
    soft_rdma_tests::tshark(pcap, args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn write_sample(name: &str, crc: bool, corrupt_frame: Option<usize>) -> (PathBuf, Vec<SampleFrame>) {
    let (mut conv, frames) = sample_capture(
        "10.200.0.1:40000".parse().unwrap(),
        "10.200.0.2:7174".parse().unwrap(),
        crc,
    )
    .unwrap();
    if let Some(i) = corrupt_frame {
        // Rebuild with one payload byte flipped in frame i (the CRC then no longer matches).
        let mut frames2 = frames.clone();
        let n = frames2[i].bytes.len();
        frames2[i].bytes[n - 6] ^= 0xFF;
        conv = soft_rdma::capture::TcpConversation::new(
            "10.200.0.1:40000".parse().unwrap(),
            "10.200.0.2:7174".parse().unwrap(),
        );
        for f in &frames2 {
            conv.send(f.direction, &f.bytes);
        }
    }
    let dir = std::env::temp_dir().join(format!("soft-rdma-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    conv.write_pcap(std::fs::File::create(&path).unwrap()).unwrap();
    (path, frames)
}

fn parse_u64(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad hex {s:?}")),
        None => s.parse().unwrap_or_else(|_| panic!("bad number {s:?}")),
    }
}

fn check_conversation(crc: bool) {
    let (pcap, frames) = write_sample(if crc { "crc.pcap" } else { "nocrc.pcap" }, crc, None);
    let fields = tshark(
        &pcap,
        &[
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "frame.number",
            "-e",
            "frame.protocols",
            "-e",
            "iwarp_mpa.rev",
            "-e",
            "iwarp_mpa.pdlength",
            "-e",
            "iwarp_mpa.crc_flag",
            "-e",
            "iwarp_mpa.ulpdulength",
            "-e",
            "iwarp_rdma.opcode",
            "-e",
            "iwarp_ddp.stag",
            "-e",
            "iwarp_ddp.qn",
            "-e",
            "iwarp_ddp.msn",
            "-e",
            "iwarp_mpa.crc",
            "-e",
            "iwarp_mpa.crc_check",
        ],
    );
    let rows: Vec<Vec<&str>> = fields.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), 3 + frames.len(), "one row per frame:\n{fields}");
    for (i, f) in frames.iter().enumerate() {
        let row = &rows[3 + i];
        let ctx = format!("frame {} ({}): {row:?}", i + 4, f.what);
        match f.opcode {
            None => {
                assert!(row[1].ends_with("iwarp_mpa"), "{ctx}");
                assert_eq!(row[2], "2", "{ctx}");
                assert_eq!(parse_u64(row[3]) as usize, f.bytes.len() - 20, "{ctx}");
                assert_eq!(row[4] == "1" || row[4] == "True", crc, "{ctx}");
            }
            Some(opcode) => {
                assert!(row[1].contains("iwarp_mpa:iwarp_ddp_rdmap"), "{ctx}");
                let ulpdu = FpduRepr::parse(&f.bytes, 65535).unwrap().ulpdu;
                assert_eq!(parse_u64(row[5]) as usize, ulpdu.len(), "{ctx}");
                assert_eq!(parse_u64(row[6]), opcode as u64, "{ctx}");
                match f.placement.unwrap() {
                    Placement::Tagged { stag, .. } => assert_eq!(parse_u64(row[7]), stag as u64, "{ctx}"),
                    Placement::Untagged { queue, msn, .. } => {
                        assert_eq!(parse_u64(row[8]), queue as u64, "{ctx}");
                        assert_eq!(parse_u64(row[9]), msn as u64, "{ctx}");
                    }
                }
                let ours = crc32c(&f.bytes[..f.bytes.len() - 4]);
                if crc {
                    // tshark shows the received CRC field read big-endian; Linux (and soft-rdma) put the CRC32c
                    // on the wire little-endian (docs/iwarp-wire.md §3), so the field is our value byte-swapped.
                    assert_eq!(parse_u64(row[11]), ours.swap_bytes() as u64, "{ctx}");
                } else {
                    assert_eq!(parse_u64(row[10]), 0, "CRC field is zero when CRC is off: {ctx}");
                }
            }
        }
    }
    // tshark verifies each CRC itself and says so in the decode tree.
    let tree = tshark(&pcap, &["-V"]);
    let fpdus = frames.iter().filter(|f| f.opcode.is_some()).count();
    assert_eq!(tree.matches("Bad CRC32").count(), 0, "tshark found a bad CRC");
    assert_eq!(
        tree.matches("Good CRC32").count(),
        if crc { fpdus } else { 0 },
        "one good CRC per FPDU"
    );
    let expert = tshark(&pcap, &["-q", "-z", "expert"]);
    let notes: Vec<&str> = expert
        .lines()
        .filter(|l| l.contains("IWARP") || l.contains("Malformed") || l.contains("DDP") || l.contains("RDMA"))
        .collect();
    for n in &notes {
        assert!(
            EXPECTED_REV2_NOTES.iter().any(|e| n.contains(e)),
            "unexpected expert note: {n}\n{expert}"
        );
    }
    assert!(!expert.contains("Errors"), "tshark reported errors:\n{expert}");
}

#[test]
fn tshark_decodes_conversation_without_crc() {
    check_conversation(false);
}

#[test]
fn tshark_decodes_conversation_with_crc() {
    check_conversation(true);
}

/// The cross-check can fail: a flipped payload byte under CRC is seen by tshark as a bad CRC.
#[test]
fn tshark_flags_a_corrupted_crc() {
    let (pcap, frames) = write_sample("corrupt.pcap", true, Some(5));
    let tree = tshark(&pcap, &["-V"]);
    assert_eq!(
        tree.matches("Bad CRC32").count(),
        1,
        "tshark must see the one corrupted FPDU ({})",
        frames[5].what
    );
    assert_eq!(
        tree.matches("Good CRC32").count(),
        frames.iter().filter(|f| f.opcode.is_some()).count() - 1
    );
}
