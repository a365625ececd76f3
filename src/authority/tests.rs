use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn headers(list: &[(&str, &str)]) -> Headers {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn encode(encoder: &mut loona_hpack::Encoder<'static>, list: &Headers) -> Vec<u8> {
    encoder.encode(list.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// grpc-go's order (authority last among pseudo-headers) and h2's (authority before path),
/// over several requests so the dynamic tables are exercised: h2's decoder reading the
/// mended blocks must see the same fields, with only invalid authorities replaced.
#[test]
fn invalid_authorities_are_mended_in_place_for_any_client_order() {
    let grpc_go = headers(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/ProxyService/Proxy"),
        (":authority", "%2Ftmp%2Fkonn.sock"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    let h2_order = headers(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "::1:8091"),
        (":path", "/AgentService/Connect"),
        ("te", "trailers"),
    ]);
    let valid = headers(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", "/x"),
    ]);
    let mut client = loona_hpack::Encoder::new();
    let mut recoder = HeaderRecoder::default();
    let mut server = loona_hpack::Decoder::new();
    for request in [&grpc_go, &h2_order, &grpc_go, &valid, &h2_order, &grpc_go] {
        let block = encode(&mut client, request);
        let mended = recoder.mend(&block).unwrap();
        if request == &valid {
            assert!(mended.is_none(), "a valid block is passed on unchanged");
        }
        let seen = server.decode(mended.as_deref().unwrap_or(&block)).unwrap();
        let expected: Headers = request
            .iter()
            .map(|(n, v)| {
                if n.as_slice() == AUTHORITY && !valid_authority(v) {
                    (n.clone(), vec![b'a'; v.len()])
                } else {
                    (n.clone(), v.clone())
                }
            })
            .collect();
        assert_eq!(seen, expected);
    }
}

#[test]
fn huffman_coded_authorities_are_mended() {
    // RFC 7541 C.6.1: the Huffman code of "Mon, 21 Oct 2013 20:13:21 GMT", which is no
    // valid authority. As a never-indexed :authority (static name index 1).
    let huffman: [u8; 22] = [
        0xd0, 0x7a, 0xbe, 0x94, 0x10, 0x54, 0xd4, 0x44, 0xa8, 0x20, 0x05, 0x95, 0x04, 0x0b, 0x81,
        0x66, 0xe0, 0x82, 0xa6, 0x2d, 0x1b, 0xff,
    ];
    let mut block = vec![0x11];
    encode_int(&mut block, huffman.len(), 7, 0x80);
    block.extend_from_slice(&huffman);
    block.push(0x84); // :path /, indexed
    let decoded = loona_hpack::Decoder::new().decode(&block).unwrap();
    assert_eq!(decoded[0].1, b"Mon, 21 Oct 2013 20:13:21 GMT");
    let mended = HeaderRecoder::default().mend(&block).unwrap().unwrap();
    let seen = loona_hpack::Decoder::new().decode(&mended).unwrap();
    let expected_value = "a".repeat(29);
    assert_eq!(
        seen,
        headers(&[(":authority", expected_value.as_str()), (":path", "/")])
    );
}

#[test]
fn undecodable_blocks_are_errors() {
    let mut recoder = HeaderRecoder::default();
    assert!(recoder.mend(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
}

#[tokio::test]
async fn mends_frames_in_a_stream_and_passes_data_through() {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let settings = frame(0x4, 0, 0, &[]);
    let request = headers(&[(":method", "POST"), (":authority", "%2Fa"), (":path", "/p")]);
    let block = encode(&mut loona_hpack::Encoder::new(), &request);
    let expected_block = HeaderRecoder::default().mend(&block).unwrap().unwrap();
    let (first, second) = block.split_at(3);
    let headers_frame = frame(HEADERS, 0, 1, first);
    let continuation = frame(CONTINUATION, END_HEADERS, 1, second);
    let data = frame(0x0, 0x1, 1, &[7u8; 16_000]);
    let mut wire = Vec::new();
    for part in [
        &preface[..],
        &settings,
        &headers_frame,
        &continuation,
        &data,
    ] {
        wire.extend_from_slice(part);
    }
    let (mut client, server) = tokio::io::duplex(1024);
    let writer = tokio::spawn(async move {
        for chunk in wire.chunks(7) {
            client.write_all(chunk).await.unwrap();
        }
    });
    let mut scrubbed = Vec::new();
    AuthorityScrub::new(server)
        .read_to_end(&mut scrubbed)
        .await
        .unwrap();
    writer.await.unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(preface);
    expected.extend_from_slice(&settings);
    expected.extend_from_slice(&frame(HEADERS, END_HEADERS, 1, &expected_block));
    expected.extend_from_slice(&data);
    let first_difference = scrubbed.iter().zip(&expected).position(|(a, b)| a != b);
    assert!(
        scrubbed == expected,
        "got {} bytes, expected {}; first difference at {first_difference:?}",
        scrubbed.len(),
        expected.len()
    );
}

/// A client's HPACK encoder that picks a representation at random for every field (indexed,
/// literal with incremental indexing, without indexing or never indexed; a name by index or
/// as a literal; raw or Huffman-coded strings) and sometimes changes the table size, keeping
/// a dynamic table as RFC 7541 says. What real clients do is a subset of this.
struct RandomEncoder {
    rng: fastrand::Rng,
    /// Newest first.
    table: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    max: usize,
}

const STATIC_AUTHORITY_INDEX: usize = 1;
const STATIC_PATH_INDEX: usize = 4;

impl RandomEncoder {
    fn size(table: &std::collections::VecDeque<(Vec<u8>, Vec<u8>)>) -> usize {
        table.iter().map(|(n, v)| n.len() + v.len() + 32).sum()
    }

    fn evict(&mut self) {
        while Self::size(&self.table) > self.max {
            self.table.pop_back();
        }
    }

    fn string(&mut self, out: &mut Vec<u8>, s: &[u8]) {
        if self.rng.bool() {
            let coded = crate::hpack::huffman_encode(s);
            encode_int(out, coded.len(), 7, 0x80);
            out.extend_from_slice(&coded);
        } else {
            encode_int(out, s.len(), 7, 0);
            out.extend_from_slice(s);
        }
    }

    fn block(&mut self, fields: &Headers) -> Vec<u8> {
        let mut out = Vec::new();
        if self.rng.u8(..) < 20 {
            self.max = self.rng.usize(0..=crate::hpack::MAX_TABLE_SIZE);
            encode_int(&mut out, self.max, 5, 0x20);
            self.evict();
        }
        for (name, value) in fields {
            let exact = self
                .table
                .iter()
                .position(|(n, v)| n == name && v == value)
                .map(|i| i + 62);
            if let (Some(index), true) = (exact, self.rng.bool()) {
                encode_int(&mut out, index, 7, 0x80);
                continue;
            }
            let name_index = match name.as_slice() {
                b":authority" => Some(STATIC_AUTHORITY_INDEX),
                b":path" => Some(STATIC_PATH_INDEX),
                _ => self
                    .table
                    .iter()
                    .position(|(n, _)| n == name)
                    .map(|i| i + 62),
            }
            .filter(|_| self.rng.bool());
            let (prefix, flags, indexing) = match self.rng.u8(0..3) {
                0 => (6, 0x40, true),
                1 => (4, 0x00, false),
                _ => (4, 0x10, false),
            };
            encode_int(&mut out, name_index.unwrap_or(0), prefix, flags);
            if name_index.is_none() {
                self.string(&mut out, name);
            }
            self.string(&mut out, value);
            if indexing {
                self.table.push_front((name.clone(), value.clone()));
                self.evict();
            }
        }
        out
    }
}

fn random_authority(rng: &mut fastrand::Rng) -> Vec<u8> {
    const CHOICES: [&str; 8] = [
        "%2Ftmp%2Fkonnectivity-server.sock",
        "::1:8091",
        "fe80::1%25eth0:8091",
        "localhost",
        "127.0.0.1:8090",
        "[::1]:8091",
        "konnectivity.kube-system.svc:8091",
        "a b",
    ];
    if rng.u8(..) < 200 {
        CHOICES[rng.usize(..CHOICES.len())].as_bytes().to_vec()
    } else {
        (0..rng.usize(0..40)).map(|_| rng.u8(0x21..0x7f)).collect()
    }
}

/// Random header lists, encoded at random, mended, then decoded by a reference decoder: every
/// field arrives as sent except invalid authorities, which arrive as `a`s of their length,
/// also when a later block refers to them through the dynamic table.
#[test]
fn randomized_blocks_decode_to_what_was_sent_with_only_invalid_authorities_replaced() {
    for seed in 0..300 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut client = RandomEncoder {
            rng: fastrand::Rng::with_seed(seed ^ 0x5eed),
            table: Default::default(),
            max: crate::hpack::MAX_TABLE_SIZE,
        };
        let mut recoder = HeaderRecoder::default();
        let mut server = loona_hpack::Decoder::new();
        // Earlier authorities come back now and then, so indexed references to them occur.
        let mut authorities: Vec<Vec<u8>> = Vec::new();
        for request in 0..12 {
            let mut fields: Headers = vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), b"/ProxyService/Proxy".to_vec()),
            ];
            let authority = match authorities.is_empty() || rng.bool() {
                true => random_authority(&mut rng),
                false => authorities[rng.usize(..authorities.len())].clone(),
            };
            authorities.push(authority.clone());
            fields.insert(rng.usize(0..=fields.len()), (AUTHORITY.to_vec(), authority));
            for _ in 0..rng.usize(0..4) {
                let name = format!("x-h{}", rng.u8(0..6)).into_bytes();
                let value: Vec<u8> = (0..rng.usize(0..300)).map(|_| rng.u8(0x20..0x7f)).collect();
                fields.push((name, value));
            }
            let block = client.block(&fields);
            let mended = recoder
                .mend(&block)
                .unwrap_or_else(|e| panic!("seed {seed} request {request}: {e}"));
            let seen = server
                .decode(mended.as_deref().unwrap_or(&block))
                .unwrap_or_else(|e| panic!("seed {seed} request {request}: {e:?}"));
            let expected: Headers = fields
                .iter()
                .map(
                    |(n, v)| match n.as_slice() == AUTHORITY && !valid_authority(v) {
                        true => (n.clone(), vec![b'a'; v.len()]),
                        false => (n.clone(), v.clone()),
                    },
                )
                .collect();
            assert_eq!(seen, expected, "seed {seed} request {request}");
        }
    }
}

/// The invariant the mending rests on, against h2 itself: an h2 server that announces another
/// HPACK table size is refused at its first write; with h2's default, requests are served.
#[tokio::test]
async fn a_server_announcing_another_table_size_is_refused() {
    async fn serve(table_size: Option<u32>) -> Result<(), String> {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut builder = h2::server::Builder::new();
            if let Some(size) = table_size {
                builder.header_table_size(size);
            }
            let mut conn = builder
                .handshake::<_, bytes::Bytes>(AuthorityScrub::new(server_io))
                .await
                .map_err(|e| e.to_string())?;
            let (request, mut respond) = match conn.accept().await {
                Some(accepted) => accepted.map_err(|e| e.to_string())?,
                None => return Err("no request".to_string()),
            };
            assert_eq!(request.uri().path(), "/x");
            respond
                .send_response(http::Response::new(()), true)
                .map_err(|e| e.to_string())?;
            // Serves until the client has its answer and goes.
            while conn.accept().await.is_some() {}
            Ok::<_, String>(())
        });
        let client = async {
            let (mut send, conn) = h2::client::handshake(client_io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let request = http::Request::post("http://localhost/x").body(()).unwrap();
            let (response, _) = send
                .send_request(request, true)
                .map_err(|e| e.to_string())?;
            response.await.map_err(|e| e.to_string()).map(|_| ())
        };
        let client = client.await;
        let server = server.await.unwrap();
        server.and(client)
    }
    serve(None)
        .await
        .expect("h2's default table size is served");
    serve(Some(4096)).await.expect("an explicit 4096 is served");
    let refused = serve(Some(8192)).await.unwrap_err();
    assert!(refused.contains("HPACK table size"), "{refused}");
}

/// Reads take a 4 KiB buffer (the allocator's fast path) until one fills it; from then on
/// they ask for 16 KiB, so a connection that carries bulk reads as much at once as before.
#[tokio::test]
async fn reads_ask_for_4_kib_until_one_fills_its_room() {
    let (mut client, server) = tokio::net::UnixStream::pair().unwrap();
    let mut scrub = AuthorityScrub::new(server);
    let mut buf = vec![0u8; 64 * 1024];

    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut got = 0;
    while got < PREFACE_LEN {
        got += scrub.read(&mut buf).await.unwrap();
    }
    assert_eq!(
        scrub.chunk, FIRST_READ_CHUNK,
        "a 24-byte read leaves the room unfilled"
    );

    // 8 KiB of frame waiting: the next read fills its 4 KiB.
    let data = frame(0x0, 0x1, 1, &[7u8; 8 * 1024]);
    client.write_all(&data).await.unwrap();
    let mut got = 0;
    while got < data.len() {
        got += scrub.read(&mut buf[got..]).await.unwrap();
    }
    assert_eq!(&buf[..data.len()], &data[..]);
    assert_eq!(scrub.chunk, READ_CHUNK);
}
