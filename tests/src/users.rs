//! Users other than root, for the tests that run soft-rdmad and RDMA programs as a container would
//! (docs/containers.md): [`Accounts`] makes a group and three system users for one test, under names unique
//! to it, and removes them on every exit path (its drop); [`Binaries`] puts soft-rdma's executables and its
//! drop-in library where those users may run them (the build tree may be closed to them: a checkout under
//! /root); [`as_user`] runs a program as one of them in a namespace, with no capability at all.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use crate::{cli_binary, daemon_binary};

/// One system user made for a test.
#[derive(Clone, Debug)]
pub struct Account {
    pub name: String,
    pub uid: u32,
}

/// The primary group every [`Account`] has (`nogroup`): what it may open comes from its supplementary groups.
pub const NOGROUP: u32 = 65534;

/// A group and the users of one test: `daemon` runs soft-rdmad and is a member of `group` (so that it may
/// give its socket to it), `member` runs programs and is a member too, `outsider` is not. Removed on drop.
pub struct Accounts {
    pub group: String,
    pub gid: u32,
    pub daemon: Account,
    pub member: Account,
    pub outsider: Account,
}

/// What was made so far, removed in reverse on drop (a creation that fails half-way leaves nothing behind).
#[derive(Default)]
struct Made {
    users: Vec<String>,
    group: Option<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for user in self.users.drain(..).rev() {
            let _ = Command::new("userdel").arg(&user).stderr(Stdio::null()).status();
        }
        if let Some(group) = self.group.take() {
            let _ = Command::new("groupdel")
                .arg(&group)
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The uid of `name`, or the gid of the group `name`.
fn id_of(user: Option<&str>, group: Option<&str>) -> Result<u32> {
    if let Some(u) = user {
        return Ok(nix::unistd::User::from_name(u)?
            .with_context(|| format!("no user {u}"))?
            .uid
            .as_raw());
    }
    let g = group.expect("a user or a group");
    Ok(nix::unistd::Group::from_name(g)?
        .with_context(|| format!("no group {g}"))?
        .gid
        .as_raw())
}

impl Accounts {
    /// Makes them (needs root: groupadd, useradd), named `sr<tag><pid>` and a suffix.
    pub fn create(tag: &str) -> Result<Accounts> {
        let base = format!("sr{tag}{}", std::process::id());
        ensure!(base.len() <= 28, "tag {tag:?} makes names too long for useradd");
        let group = format!("{base}g");
        let mut made = Made::default();
        run(Command::new("groupadd").args(["--system", &group]))?;
        made.group = Some(group.clone());
        let gid = id_of(None, Some(&group))?;
        let mut user = |suffix: &str, groups: &[&str]| -> Result<Account> {
            let name = format!("{base}{suffix}");
            let mut cmd = Command::new("useradd");
            cmd.args([
                "--system",
                "--no-create-home",
                "--no-user-group",
                "--gid",
                "nogroup",
            ])
            .args(["--shell", "/usr/sbin/nologin"]);
            if !groups.is_empty() {
                cmd.args(["--groups", &groups.join(",")]);
            }
            run(cmd.arg(&name))?;
            made.users.push(name.clone());
            Ok(Account {
                uid: id_of(Some(&name), None)?,
                name,
            })
        };
        let daemon = user("d", &[&group])?;
        let member = user("m", &[&group])?;
        let outsider = user("o", &[])?;
        // From here on the accounts' drop removes them.
        std::mem::forget(made);
        Ok(Accounts {
            group,
            gid,
            daemon,
            member,
            outsider,
        })
    }

    /// The supplementary groups `who` has (as `id` would list them, the primary one aside).
    pub fn groups_of(&self, who: &Account) -> Vec<u32> {
        if who.uid == self.outsider.uid {
            Vec::new()
        } else {
            vec![self.gid]
        }
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        drop(Made {
            users: vec![
                self.daemon.name.clone(),
                self.member.name.clone(),
                self.outsider.name.clone(),
            ],
            group: Some(self.group.clone()),
        });
    }
}

/// `program` in namespace `ns` as `who` (primary group [`NOGROUP`], supplementary `groups` only), with no
/// capability (none inheritable, an empty bounding set) and no way to gain one (no_new_privs): `ip netns
/// exec NS setpriv … program`. Both exec, so the child's pid is the program's.
pub fn as_user(ns: &str, who: &Account, groups: &[u32], program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "setpriv"])
        .arg(format!("--reuid={}", who.uid))
        .arg(format!("--regid={NOGROUP}"));
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        c.arg(format!("--groups={}", list.join(",")));
    }
    c.args(["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"])
        .arg(program);
    c
}

/// soft-rdmad, the CLI and the drop-in library (with the link directory `soft-rdma run` puts on
/// `LD_LIBRARY_PATH`) in a directory every user may read and search.
pub struct Binaries {
    pub daemon: PathBuf,
    pub cli: PathBuf,
}

impl Binaries {
    /// Links (or copies, across file systems) them into `dir`, made mode 0755.
    pub fn place(dir: &Path) -> Result<Binaries> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        let cli_src = cli_binary()?;
        let lib_src = cli_src.with_file_name("libsoft_rdma_verbs.so");
        if !lib_src.is_file() {
            bail!(
                "{} missing: build it (`cargo build -p soft-rdma-verbs`)",
                lib_src.display()
            );
        }
        let mut placed = Vec::new();
        for src in [daemon_binary()?, cli_src, lib_src] {
            let to = dir.join(src.file_name().context("a file name")?);
            let _ = std::fs::remove_file(&to);
            if std::fs::hard_link(&src, &to).is_err() {
                std::fs::copy(&src, &to).with_context(|| format!("copying {}", src.display()))?;
            }
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
            placed.push(to);
        }
        let b = Binaries {
            daemon: placed[0].clone(),
            cli: placed[1].clone(),
        };
        // The link directory beside the library, made once as root (the users may not write here), as a
        // package ships it.
        run(Command::new(&b.cli).args(["run", "--", "true"]))?;
        Ok(b)
    }
}
