//! CUDA graphs' requests and commands, and host points, in the consolidated role: bad ones
//! fail with errors and hurt nobody (the rest of the consolidated role's hostile inputs:
//! `consolidated_hostile.rs`).

use gpushare::ErrorCode;
use gpushare_protocol::Command;
use gpushare_protocol::command::opcode;
use gpushare_protocol::control::{BrokerMessage, ClientMessage};
use gpushare_protocol::ring::SubmissionEntry;
use gpushare_tests::hostile::{
    Bystander, assert_fails, consolidated, sim_broker, status_of, submit_noise,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// CUDA graphs' requests and commands, and host points, with bad arguments fail with errors:
/// a graph file that is missing, short, too large, not a graph, or names functions the
/// session does not have; launches, updates and drops of graphs that do not exist; host
/// points outside the client's host memory. Noise on their opcodes hurts nobody.
#[test]
fn hostile_graph_requests_and_commands_fail_with_errors() {
    use gpushare_protocol::graph::{GraphNode, GraphOp, MAX_GRAPH_BYTES, encode_graph};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let raw = consolidated(&broker);
    let file_of = |bytes: &[u8]| {
        let mut f = tempfile::tempfile().expect("a file");
        f.write_all(bytes).expect("write");
        f
    };
    let make = |bytes: u64, fds: &[i32]| match raw
        .request(&ClientMessage::MakeGraph { request: 9, bytes }, fds)
    {
        Some(BrokerMessage::GraphMade { result, .. }) => result,
        other => panic!("MakeGraph answered {other:?}"),
    };
    let kernel = |function| GraphNode {
        deps: vec![],
        op: GraphOp::Kernel {
            function,
            grid: [1; 3],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            attributes: Default::default(),
            params: vec![0; 8],
        },
    };
    let unknown = encode_graph(&[kernel(77)]).expect("encode");
    let shapeless = encode_graph(&[GraphNode {
        deps: vec![],
        op: GraphOp::Memset {
            dst: 0x1000,
            value: 0,
            elem_bytes: 3,
            count: 4,
        },
    }])
    .expect("encode");
    let cases: Vec<(Vec<u8>, u64, ErrorCode)> = vec![
        (
            unknown.clone(),
            unknown.len() as u64,
            ErrorCode::InvalidHandle,
        ),
        (
            unknown.clone(),
            unknown.len() as u64 + 10,
            ErrorCode::InvalidArgument,
        ),
        (vec![0xff; 64], 64, ErrorCode::InvalidArgument),
        (
            shapeless.clone(),
            shapeless.len() as u64,
            ErrorCode::InvalidArgument,
        ),
        (vec![], MAX_GRAPH_BYTES + 1, ErrorCode::InvalidArgument),
    ];
    for (bytes, announced, want) in cases {
        let f = file_of(&bytes);
        let got = make(announced, &[f.as_raw_fd()]);
        assert_eq!(
            got.map_err(|e| e.code),
            Err(want),
            "{} bytes, {announced} announced",
            bytes.len()
        );
    }
    assert_eq!(
        make(8, &[]).map_err(|e| e.code),
        Err(ErrorCode::InvalidArgument),
        "no file"
    );
    // A graph of the session's own memory: launched, then its copy's memory freed, then
    // dropped once.
    let buf = raw
        .submit_one(Command::Alloc { bytes: 1 << 16 })
        .expect("alloc");
    assert_eq!(buf.status, 0);
    let copy = encode_graph(&[GraphNode {
        deps: vec![],
        op: GraphOp::Copy {
            src: buf.result,
            dst: buf.result + (1 << 15),
            len: 1 << 15,
        },
    }])
    .expect("encode");
    let f = file_of(&copy);
    let graph = make(copy.len() as u64, &[f.as_raw_fd()]).expect("a graph of its own memory");
    assert_eq!(
        status_of(&raw, Command::LaunchGraph { stream: 0, graph }),
        0
    );
    assert_eq!(
        status_of(&raw, Command::StreamSync { stream: 0 }),
        0,
        "the launch ran"
    );
    assert_eq!(status_of(&raw, Command::Free { ptr: buf.result }), 0);
    assert_fails(
        &raw,
        Command::LaunchGraph { stream: 0, graph },
        ErrorCode::InvalidPointer,
    );
    assert_eq!(status_of(&raw, Command::DropGraph { graph }), 0);
    use ErrorCode::*;
    for (cmd, want) in [
        (Command::DropGraph { graph }, InvalidHandle),
        (
            Command::LaunchGraph {
                stream: 0,
                graph: 1,
            },
            InvalidHandle,
        ),
        (Command::DropGraph { graph: 1 }, InvalidHandle),
        (
            Command::UpdateGraph {
                graph: 1,
                params_offset: 0,
                params_len: 16,
            },
            InvalidHandle,
        ),
        (
            Command::StreamHostPoint {
                stream: 0,
                done: 0x1000,
                go: 0x1004,
                value: 1,
            },
            InvalidPointer,
        ),
    ] {
        assert_fails(&raw, cmd, want);
    }
    let mut rng = StdRng::seed_from_u64(0x6772_6170);
    let opcodes = [
        opcode::LAUNCH_GRAPH,
        opcode::DROP_GRAPH,
        opcode::UPDATE_GRAPH,
        opcode::STREAM_HOST_POINT,
    ];
    let noise: Vec<SubmissionEntry> = (0..2000)
        .map(|i| {
            let mut e = SubmissionEntry {
                user_tag: i,
                opcode: opcodes[rng.random_range(0..opcodes.len())],
                stream: rng.random_range(0..3),
                ..Default::default()
            };
            for a in &mut e.args[..3] {
                *a = match rng.random_range(0..3) {
                    0 => rng.random_range(0..8),
                    1 => rng.random_range(0..1 << 20),
                    _ => rng.random(),
                };
            }
            e
        })
        .collect();
    submit_noise(&broker, &bystander, raw, &noise);
}
