//! cgroup v2 device programs, built, read back and attached the way
//! Slurm's cgroup/v2 plugin builds and attaches them
//! (src/plugins/cgroup/v2/ebpf.c): instructions written by hand, loaded
//! and attached with bpf(2), no libbpf.
//!
//! The program sees `struct bpf_cgroup_dev_ctx { u32 access_type; u32
//! major; u32 minor; }` (access_type: the access in its upper 16 bits, the
//! device type in its lower 16) and returns 1 to allow, 0 to deny. Slurm's
//! is a [`Policy`]: a header loading the type, access, major and minor into
//! r2..r5, then one rule per device (`if type == T && major == M && minor
//! == N return ACCEPT`, each test optional), then a default. [`decode`]
//! reads such a program back from its instructions (the kernel hands
//! them out: [`attached_program`]), so a grant can keep every rule Slurm
//! wrote and add its own in front.
//!
//! The only `unsafe` of this module is the bpf(2) system call itself; the
//! attribute structs are plain `repr(C)` data, zeroed before use.

use crate::device::Device;
use std::ffi::c_long;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Insn {
    code: u8,
    /// dst register in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const BPF_LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const BPF_ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_ALU32_RSH_K: u8 = 0x74; // BPF_ALU | BPF_RSH | BPF_K
const BPF_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const BPF_MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const BPF_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
/// `bpf_cgroup_dev_ctx`'s device types.
pub const DEV_BLOCK: u32 = 1;
pub const DEV_CHAR: u32 = 2;

const BPF_PROG_LOAD: c_long = 5;
const BPF_PROG_ATTACH: c_long = 8;
const BPF_PROG_GET_FD_BY_ID: c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: c_long = 15;
const BPF_PROG_QUERY: c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
/// A program in a descendant cgroup overrides this one (Slurm's job and
/// step programs).
pub const BPF_F_ALLOW_OVERRIDE: u32 = 1;
/// Programs of this cgroup and its ancestors all run (systemd's).
pub const BPF_F_ALLOW_MULTI: u32 = 2;

impl Insn {
    /// `code` on `dst` and `src` (registers 0..10) with an offset and an
    /// immediate.
    pub fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn { code, regs: (dst & 0xf) | (src << 4), off, imm }
    }
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn::new(code, dst, src, off, imm)
}

/// One rule of a device program: the access matches when each given field
/// equals the device's (`None`: any), and then `allow` is the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub dev_type: Option<u32>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub allow: bool,
}

impl Rule {
    /// The rule answering `allow` for character device `d`.
    pub fn char_device(d: Device, allow: bool) -> Rule {
        Rule { dev_type: Some(DEV_CHAR), major: Some(d.major), minor: Some(d.minor), allow }
    }
}

/// A device program's meaning: the first matching rule answers, else the
/// default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub default_allow: bool,
}

impl Policy {
    /// What the program answers for an access to `dev_type` `major:minor`.
    pub fn allows(&self, dev_type: u32, major: u32, minor: u32) -> bool {
        let hit = |r: &&Rule| {
            r.dev_type.is_none_or(|t| t == dev_type)
                && r.major.is_none_or(|m| m == major)
                && r.minor.is_none_or(|m| m == minor)
        };
        self.rules.iter().find(hit).map_or(self.default_allow, |r| r.allow)
    }
}

/// Slurm's header (init_ebpf_prog): r2 = type, r3 = access, r4 = major,
/// r5 = minor.
fn header() -> [Insn; 6] {
    [
        insn(BPF_LDX_MEM_W, 2, 1, 0, 0),
        insn(BPF_ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(BPF_LDX_MEM_W, 3, 1, 0, 0),
        insn(BPF_ALU32_RSH_K, 3, 0, 0, 16),
        insn(BPF_LDX_MEM_W, 4, 1, 4, 0),
        insn(BPF_LDX_MEM_W, 5, 1, 8, 0),
    ]
}

/// The instructions of `policy`, laid out as Slurm's add_device_ebpf_prog
/// and close_ebpf_prog lay them out.
pub fn encode(policy: &Policy) -> Vec<Insn> {
    let mut p = header().to_vec();
    for r in &policy.rules {
        let tests: Vec<(u8, u32)> =
            [(2, r.dev_type), (4, r.major), (5, r.minor)].into_iter().filter_map(|(reg, v)| Some((reg, v?))).collect();
        // Each failed test jumps past the rule's remaining tests and its
        // `return`.
        for (k, (reg, v)) in tests.iter().enumerate() {
            let skip = (tests.len() - k - 1 + 2) as i16;
            p.push(insn(BPF_JNE_K, *reg, 0, skip, *v as i32));
        }
        p.push(insn(BPF_MOV64_K, 0, 0, 0, r.allow as i32));
        p.push(insn(BPF_EXIT, 0, 0, 0, 0));
    }
    p.push(insn(BPF_MOV64_K, 0, 0, 0, policy.default_allow as i32));
    p.push(insn(BPF_EXIT, 0, 0, 0, 0));
    p
}

/// The policy of a device program built as Slurm builds them (or as
/// [`encode`] does); any other shape is refused with the instruction that
/// does not fit, since a rule misread could open a device Slurm denied.
pub fn decode(p: &[Insn]) -> Result<Policy, String> {
    let head = header();
    // Slurm's header; that of older builders (earlier CARMA builds among
    // them) lacks the access load (r3), which no rule reads.
    let short = [head[0], head[1], head[4], head[5]];
    let mut at = if p.starts_with(&head) {
        head.len()
    } else if p.starts_with(&short) {
        short.len()
    } else {
        return Err("the program does not start by loading the device's type, major and minor".into());
    };
    let bad = |at: usize, what: &str| format!("instruction {at} ({:?}): {what}", p.get(at));
    let mut rules = Vec::new();
    loop {
        let start = at;
        let mut rule = Rule { dev_type: None, major: None, minor: None, allow: false };
        while let Some(i) = p.get(at).filter(|i| i.code == BPF_JNE_K) {
            let field = match i.regs {
                2 => &mut rule.dev_type,
                4 => &mut rule.major,
                5 => &mut rule.minor,
                _ => return Err(bad(at, "a test of another register than type, major or minor")),
            };
            if field.replace(i.imm as u32).is_some() {
                return Err(bad(at, "a field tested twice in one rule"));
            }
            at += 1;
        }
        let (Some(mov), Some(exit)) = (p.get(at), p.get(at + 1)) else {
            return Err(bad(at, "the program ends without a return"));
        };
        if mov.code != BPF_MOV64_K || mov.regs != 0 || !(mov.imm == 0 || mov.imm == 1) || exit.code != BPF_EXIT {
            return Err(bad(at, "not `r0 = 0 or 1; exit`"));
        }
        let end = at + 2;
        // Every test of the rule must skip to the rule's end, no further.
        for (k, i) in p[start..at].iter().enumerate() {
            if (start + k + 1) as i64 + i64::from(i.off) != end as i64 {
                return Err(bad(start + k, "a jump that does not land on the next rule"));
            }
        }
        let allow = mov.imm == 1;
        if start == at {
            // No test: the default, which must end the program.
            if end != p.len() {
                return Err(bad(end, "instructions after the default"));
            }
            return Ok(Policy { rules, default_allow: allow });
        }
        rule.allow = allow;
        rules.push(rule);
        at = end;
    }
}

/// A program that denies each of `deny` (character devices) and allows
/// any other access.
pub fn deny_program(deny: &[Device]) -> Vec<Insn> {
    encode(&Policy { rules: deny.iter().map(|&d| Rule::char_device(d, false)).collect(), default_allow: true })
}

#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
}

/// bpf(2) on one attribute struct; the return value, or errno and the
/// message naming it (errno taken before anything else can change it).
fn bpf<T>(cmd: c_long, attr: &mut T, what: &str) -> Result<i32, (i32, String)> {
    // SAFETY: `attr` is a live, initialised repr(C) struct of the layout
    // the kernel expects for `cmd`, and its size is passed with it; the
    // kernel reads and writes only within it (and, for PROG_LOAD, the
    // instruction and license buffers whose pointers it holds, which the
    // caller keeps alive across the call).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        Err((err.raw_os_error().unwrap_or(0), format!("{what}: {err}")))
    } else {
        Ok(rc as i32)
    }
}

/// Loads `program` as a cgroup device program.
pub fn load(program: &[Insn]) -> Result<OwnedFd, String> {
    let license = b"Apache-2.0\0";
    let mut name = [0u8; 16];
    name[..5].copy_from_slice(b"carma");
    let mut attr = LoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(program.len()).map_err(|_| "program too long")?,
        insns: program.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        ..LoadAttr::default()
    };
    // The verifier answers EAGAIN when interrupted (a signal, memory
    // pressure); libbpf tries 5 times, and so do we.
    let mut tries = 0;
    let fd = loop {
        tries += 1;
        match bpf(BPF_PROG_LOAD, &mut attr, "loading the device program") {
            Err((libc::EAGAIN, _)) if tries < 5 => continue,
            other => break other.map_err(|(_, msg)| msg)?,
        }
    };
    // SAFETY: a successful BPF_PROG_LOAD returns a new file descriptor
    // that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir(dir: &Path) -> Result<std::fs::File, String> {
    std::fs::File::open(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// The device program attached to `cgroup` itself: its attach flags and
/// id, or `None` where none is.
pub fn attached(cgroup: &Path) -> Result<Option<(u32, u32)>, String> {
    let dir = open_dir(cgroup)?;
    // One id is enough for a program attached without BPF_F_ALLOW_MULTI;
    // with it (systemd's) the first of several.
    let mut ids = [0u32; 64];
    let mut attr = QueryAttr {
        target_fd: dir.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..QueryAttr::default()
    };
    bpf(BPF_PROG_QUERY, &mut attr, &format!("querying the device programs of {}", cgroup.display()))
        .map_err(|(_, m)| m)?;
    Ok((attr.prog_cnt > 0).then_some((attr.attach_flags, ids[0])))
}

/// The flags of the device program attached to `cgroup` itself, or `None`
/// where none is.
pub fn attached_flags(cgroup: &Path) -> Result<Option<u32>, String> {
    Ok(attached(cgroup)?.map(|(flags, _)| flags))
}

#[repr(C)]
#[derive(Default)]
struct GetFdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info`, up to the instructions' pointers
/// (the kernel fills as much as it is given).
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
}

/// The instructions of the loaded program `id`, as the verifier left them
/// (for a device program, the loaded ones: its context is read directly).
pub fn program(id: u32) -> Result<Vec<Insn>, String> {
    let mut get = GetFdAttr { prog_id: id, ..GetFdAttr::default() };
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut get, &format!("opening device program {id}")).map_err(|(_, m)| m)?;
    // SAFETY: a successful BPF_PROG_GET_FD_BY_ID returns a new file
    // descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let what = format!("reading device program {id}");
    let mut info = ProgInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfo>() as u32,
        info: &mut info as *mut ProgInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr, &what).map_err(|(_, m)| m)?;
    if info.prog_type != BPF_PROG_TYPE_CGROUP_DEVICE {
        return Err(format!("{what}: not a device program (type {})", info.prog_type));
    }
    let n = info.xlated_prog_len as usize / std::mem::size_of::<Insn>();
    if n == 0 {
        return Err(format!("{what}: the kernel shows no instructions (not CAP_SYS_ADMIN?)"));
    }
    let mut insns = vec![Insn::default(); n];
    let mut info = ProgInfo {
        xlated_prog_len: info.xlated_prog_len,
        xlated_prog_insns: insns.as_mut_ptr() as u64,
        ..ProgInfo::default()
    };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfo>() as u32,
        info: &mut info as *mut ProgInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr, &what).map_err(|(_, m)| m)?;
    // kernel.kptr_restrict can hide them (the pointer comes back zeroed).
    if info.xlated_prog_insns == 0 || info.xlated_prog_len as usize != n * std::mem::size_of::<Insn>() {
        return Err(format!("{what}: the kernel withheld its instructions (kernel.kptr_restrict?)"));
    }
    Ok(insns)
}

/// Attaches `program` to `cgroup` with `flags`. A program attached there
/// with the same flags (and without BPF_F_ALLOW_MULTI) is replaced in one
/// step: the cgroup is never without a program.
pub fn attach(cgroup: &Path, program: &OwnedFd, flags: u32) -> Result<(), String> {
    let dir = open_dir(cgroup)?;
    let mut attr = AttachAttr {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: program.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: flags,
        ..AttachAttr::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attr, &format!("attaching the device program to {}", cgroup.display()))
        .map_err(|(_, m)| m)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(minor: u32) -> Device {
        Device { major: 195, minor }
    }

    #[test]
    fn a_failed_call_returns_the_errno_it_failed_with() {
        // No such command: the kernel answers EINVAL (or EPERM without
        // CAP_BPF), and the errno returned is the one the message names.
        let mut attr = QueryAttr::default();
        let (errno, msg) = bpf(-1, &mut attr, "probing").unwrap_err();
        assert!([libc::EINVAL, libc::EPERM].contains(&errno), "{errno} {msg}");
        assert!(msg.starts_with("probing: ") && msg.contains(&format!("os error {errno}")), "{msg}");
    }

    #[test]
    fn one_rule_per_denied_device_then_allow() {
        let p = deny_program(&[gpu(0), gpu(2)]);
        assert_eq!(p.len(), 6 + 2 * 5 + 2);
        // Each rule's jumps land on the next rule (or the final allow).
        for rule in 0..2 {
            let at = 6 + rule * 5;
            for k in 0..3 {
                let i = p[at + k];
                assert_eq!(i.code, BPF_JNE_K);
                assert_eq!(at + k + 1 + i.off as usize, at + 5);
            }
        }
        assert_eq!(p[6 + 5 + 2].imm, 2, "the second rule's minor");
        assert_eq!((p[p.len() - 2].code, p[p.len() - 2].imm), (BPF_MOV64_K, 1));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn programs_read_back_to_the_policy_they_were_built_from() {
        // As Slurm writes them: rules with a wildcard minor or no type.
        let policy = Policy {
            rules: vec![
                Rule::char_device(gpu(1), false),
                Rule { dev_type: Some(DEV_CHAR), major: Some(508), minor: None, allow: false },
                Rule { dev_type: None, major: Some(240), minor: Some(3), allow: true },
            ],
            default_allow: true,
        };
        assert_eq!(decode(&encode(&policy)).unwrap(), policy);
        assert!(!policy.allows(DEV_CHAR, 195, 1));
        assert!(policy.allows(DEV_CHAR, 195, 0));
        assert!(!policy.allows(DEV_CHAR, 508, 7));
        assert!(policy.allows(DEV_BLOCK, 508, 7));
        let deny_all = Policy { rules: vec![], default_allow: false };
        assert_eq!(decode(&encode(&deny_all)).unwrap(), deny_all);
        // The older builders' header (no access load) still reads.
        let old: Vec<Insn> = [&header()[..2], &header()[4..], &encode(&policy)[6..]].concat();
        assert_eq!(decode(&old).unwrap(), policy);
    }

    #[test]
    fn a_program_of_another_shape_is_refused() {
        let p = encode(&Policy { rules: vec![Rule::char_device(gpu(1), false)], default_allow: true });
        // A jump past the next rule, a test of the access register, a
        // missing default, a return of another value.
        let mut far = p.clone();
        far[6].off += 1;
        assert!(decode(&far).unwrap_err().contains("next rule"), "{:?}", decode(&far));
        let mut access = p.clone();
        access[7].regs = 3;
        assert!(decode(&access).unwrap_err().contains("register"));
        assert!(decode(&p[..p.len() - 2]).unwrap_err().contains("without a return"));
        let mut two = p.clone();
        let n = two.len();
        two[n - 2].imm = 2;
        assert!(decode(&two).is_err());
        assert!(decode(&p[1..]).unwrap_err().contains("does not start"));
    }
}
