//! The GPU host transport's shared segment across real processes, without CUDA: a rank
//! process mapping rank 0's segment sees the same pages; once every rank has mapped it the
//! name is gone, so a SIGKILLed peer leaves nothing in /dev/shm; a creator SIGKILLed before
//! that leaves a name carrying the job id, which the launcher's cleanup removes.
//! (Registering the mapping with CUDA is the GPU machine's part: scripts/gpu-host-procs.sh.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tpar::transport::host_segment::{HostLayout, HostSegment};
use tpar::transport::shm::{leftover_segments, remove_leftovers};

const CHILD: &str = "TPAR_TEST_HOST_SEGMENT_CHILD";
const MARK: u32 = 0x00c0_ffee;

fn layout() -> HostLayout {
    HostLayout::new(2, 8 * 4096, 4864).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// This test binary again, running only [`child`] with `role`.
fn spawn(role: &str, job: u64, welcome: &[u8]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{role} {job:016x} {}", hex(welcome)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// What follows `READY ` on the child's stdout.
fn ready_line(c: &mut Child) -> String {
    let out = c.stdout.take().unwrap();
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        // libtest may print "test child ... " on the same line first.
        if let Some(i) = line.find("READY ") {
            return line[i + 6..].trim().to_string();
        }
    }
    panic!("the child ended without saying READY");
}

/// The child side: `attach` maps the welcome as rank 1 and writes MARK into its own data
/// area; `create` creates the segment as rank 0 and prints the welcome. Then both wait to
/// be killed.
#[test]
fn child() {
    let Ok(v) = std::env::var(CHILD) else { return };
    let mut it = v.split(' ');
    let (role, job) = (it.next().unwrap(), u64::from_str_radix(it.next().unwrap(), 16).unwrap());
    let l = layout();
    let seg = match role {
        "attach" => {
            let s = HostSegment::attach(job, 1, l, &unhex(it.next().unwrap())).unwrap();
            // SAFETY: the mapping is live and rank 1's data area lies inside it.
            unsafe { std::ptr::write_volatile((s.as_ptr() as *mut u8).add(l.data_offset(1)) as *mut u32, MARK) };
            println!("READY attached");
            s
        }
        _ => {
            let (s, welcome) = HostSegment::create(job, 0, l, 4096, 0xffff_ffff).unwrap();
            println!("READY {}", hex(&welcome));
            s
        }
    };
    std::thread::sleep(Duration::from_secs(60));
    drop(seg);
    panic!("the parent should have killed this child");
}

fn kill(mut c: Child) {
    c.kill().unwrap(); // SIGKILL: no destructor runs
    c.wait().unwrap();
}

#[test]
fn a_peer_killed_after_the_join_leaves_nothing_and_the_survivor_keeps_its_mapping() {
    let job = rand::random::<u64>();
    let tag = format!("{job:016x}");
    let l = layout();
    let (mut rank0, welcome) = HostSegment::create(job, 0, l, 4096, 0xffff_ffff).unwrap();
    let mut c = spawn("attach", job, &welcome);
    assert_eq!(ready_line(&mut c), "attached");
    // The child's store is in this process's mapping: the same pages.
    let t = Instant::now();
    while rank0.read_u32(l.data_offset(1)) != Some(MARK) {
        assert!(t.elapsed() < Duration::from_secs(10), "rank 1's store never showed in rank 0's mapping");
        std::thread::yield_now();
    }
    // Every rank has mapped it: the name goes (what GpuCommunicator::init does after its barrier).
    rank0.unlink().unwrap();
    assert!(leftover_segments(&tag).is_empty());
    kill(c);
    assert!(leftover_segments(&tag).is_empty(), "nothing of the job may be left in /dev/shm");
    assert_eq!(rank0.read_u32(l.data_offset(1)), Some(MARK));
    assert_eq!(rank0.read_u32(l.data_offset(0)), Some(0xffff_ffff));
}

#[test]
fn a_creator_killed_before_the_unlink_leaves_a_name_the_launcher_removes() {
    let job = rand::random::<u64>();
    let tag = format!("{job:016x}");
    let mut c = spawn("create", job, &[]);
    let welcome = unhex(&ready_line(&mut c));
    let peer = HostSegment::attach(job, 1, layout(), &welcome).unwrap();
    assert_eq!(peer.read_u32(layout().data_offset(1)), Some(0xffff_ffff));
    kill(c);
    let left = leftover_segments(&tag);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with("-gpuhost"), "{left:?}");
    // The launcher's cleanup (tpar-cli's harness::launch, on every exit) finds it by job id.
    assert_eq!(remove_leftovers(&tag), 1);
    assert!(leftover_segments(&tag).is_empty());
    // A live mapping outlives its name.
    assert_eq!(peer.read_u32(layout().data_offset(0)), Some(0xffff_ffff));
}
