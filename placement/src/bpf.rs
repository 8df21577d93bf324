//! cgroup v2 device programs, built and attached the way Slurm's
//! cgroup/v2 plugin does it (src/plugins/cgroup/v2/ebpf.c): instructions
//! written by hand, loaded and attached with bpf(2), no libbpf.
//!
//! The program sees `struct bpf_cgroup_dev_ctx { u32 access_type; u32
//! major; u32 minor; }` (access_type: the access in its upper 16 bits, the
//! device type in its lower 16) and returns 1 to allow, 0 to deny. Ours
//! denies each listed character device and allows everything else, as
//! Slurm's denies the GRES devices a step was not given and accepts the
//! rest.
//!
//! The only `unsafe` of this module is the bpf(2) system call itself; the
//! attribute structs are plain `repr(C)` data, zeroed before use.

use crate::devices::Device;
use std::ffi::c_long;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    /// dst register in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const BPF_LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const BPF_ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const BPF_MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const BPF_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
const BPF_DEVCG_DEV_CHAR: i32 = 2;

const BPF_PROG_LOAD: c_long = 5;
const BPF_PROG_ATTACH: c_long = 8;
const BPF_PROG_QUERY: c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
/// A program in a descendant cgroup overrides this one (Slurm's job and
/// step programs).
pub const BPF_F_ALLOW_OVERRIDE: u32 = 1;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (dst & 0xf) | (src << 4), off, imm }
}

/// A program that denies each of `deny` (character devices) and allows
/// any other access.
pub fn deny_program(deny: &[Device]) -> Vec<Insn> {
    let mut p = vec![
        // r2 = ctx->access_type & 0xffff (the device type)
        insn(BPF_LDX_MEM_W, 2, 1, 0, 0),
        insn(BPF_ALU32_AND_K, 2, 0, 0, 0xffff),
        // r4 = ctx->major, r5 = ctx->minor
        insn(BPF_LDX_MEM_W, 4, 1, 4, 0),
        insn(BPF_LDX_MEM_W, 5, 1, 8, 0),
    ];
    for d in deny {
        // Each rule is 5 instructions: three tests that skip the rest of
        // the rule when they do not match, then `return 0`.
        p.push(insn(BPF_JNE_K, 2, 0, 4, BPF_DEVCG_DEV_CHAR));
        p.push(insn(BPF_JNE_K, 4, 0, 3, d.major as i32));
        p.push(insn(BPF_JNE_K, 5, 0, 2, d.minor as i32));
        p.push(insn(BPF_MOV64_K, 0, 0, 0, 0));
        p.push(insn(BPF_EXIT, 0, 0, 0, 0));
    }
    p.push(insn(BPF_MOV64_K, 0, 0, 0, 1));
    p.push(insn(BPF_EXIT, 0, 0, 0, 0));
    p
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

/// The flags of the device program attached to `cgroup` itself, or `None`
/// where none is.
pub fn attached_flags(cgroup: &Path) -> Result<Option<u32>, String> {
    let dir = open_dir(cgroup)?;
    let mut attr =
        QueryAttr { target_fd: dir.as_raw_fd() as u32, attach_type: BPF_CGROUP_DEVICE, ..QueryAttr::default() };
    bpf(BPF_PROG_QUERY, &mut attr, &format!("querying {}", cgroup.display())).map_err(|(_, m)| m)?;
    Ok((attr.prog_cnt > 0).then_some(attr.attach_flags))
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
        let p = deny_program(&[Device { major: 195, minor: 0 }, Device { major: 195, minor: 2 }]);
        assert_eq!(p.len(), 4 + 2 * 5 + 2);
        // Each rule's jumps land on the next rule (or the final allow).
        for rule in 0..2 {
            let at = 4 + rule * 5;
            for k in 0..3 {
                let i = p[at + k];
                assert_eq!(i.code, BPF_JNE_K);
                assert_eq!(at + k + 1 + i.off as usize, at + 5);
            }
        }
        assert_eq!(p[4 + 5 + 2].imm, 2, "the second rule's minor");
        assert_eq!((p[p.len() - 2].code, p[p.len() - 2].imm), (BPF_MOV64_K, 1));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }
}
