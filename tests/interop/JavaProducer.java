// Apache Kafka's own Java producer (kafka-clients, from the broker's jar folder) writing msgpack
// samples the way a production service would: any compression codec, transactions (some
// aborted), keys, headers, tombstones and record timestamps of its own. None of our Python
// writes these records. Compiled by tests/interop/javaclients.py with javac against the jars.
//
//   java -cp <classes>:<kafka libs>/* JavaProducer BOOTSTRAP TOPIC MANIFEST PHASE [PHASE...]
//
// A PHASE is comma-separated key=value settings, run one after the other with a producer each:
//   records=N          records to write (0: until SIGTERM)             [default 1000]
//   codec=C            compression.type: none, gzip, snappy, lz4, zstd  [none]
//   txn=K              K records per transaction (0: no transactions)   [0]
//   abort_every=M      abort every M-th transaction (0: never)          [0]
//   keys=1             give every record a key                          [0]
//   headers=1          give every record two headers                    [0]
//   tombstone_every=T  every T-th record has a null value (a tombstone) [0]
//   ts_offset_ms=X     record timestamp = now + X (a clock ahead of the consumer's) [unset]
//   rate=R             records per second (0: as fast as possible)      [0]
//   seed=S             random seed of the payloads                      [1]
//
// MANIFEST gets one line per record that reached the log: "partition,offset,kind" with kind
// committed (a committed transaction's or a plain record), aborted, or tombstone.
import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaProducer {
    static final AtomicBoolean STOP = new AtomicBoolean(false);
    static final int FEATURES = 16;

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: JavaProducer BOOTSTRAP TOPIC MANIFEST PHASE [PHASE...]");
            System.exit(2);
        }
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            STOP.set(true); // SIGTERM: finish the transaction under way, write its manifest lines
            try {
                main.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        try (PrintWriter manifest = new PrintWriter(new FileWriter(args[2], true))) {
            for (int i = 3; i < args.length && !STOP.get(); i++) {
                runPhase(args[0], args[1], manifest, parse(args[i]), i);
            }
        }
    }

    static Map<String, String> parse(String phase) {
        Map<String, String> out = new HashMap<>();
        for (String kv : phase.split(",")) {
            if (kv.isBlank()) continue;
            String[] parts = kv.split("=", 2);
            out.put(parts[0].trim(), parts.length > 1 ? parts[1].trim() : "1");
        }
        return out;
    }

    static long num(Map<String, String> p, String key, long dflt) {
        return p.containsKey(key) ? Long.parseLong(p.get(key)) : dflt;
    }

    // A msgpack map {"x": bin(16 float32 little-endian), "y": float64}: y = tanh(sum(x) / 4).
    static byte[] sample(Random rng) {
        ByteBuffer x = ByteBuffer.allocate(FEATURES * 4).order(ByteOrder.LITTLE_ENDIAN);
        double sum = 0;
        for (int i = 0; i < FEATURES; i++) {
            float v = (float) rng.nextGaussian();
            x.putFloat(v);
            sum += v;
        }
        ByteBuffer out = ByteBuffer.allocate(1 + 2 + 2 + FEATURES * 4 + 2 + 9);
        out.put((byte) 0x82);
        out.put((byte) 0xa1).put((byte) 'x');
        out.put((byte) 0xc4).put((byte) (FEATURES * 4)).put(x.array());
        out.put((byte) 0xa1).put((byte) 'y');
        out.put((byte) 0xcb).putDouble(Math.tanh(sum / 4.0)); // msgpack floats are big-endian
        return out.array();
    }

    // commitTransaction may time out while the broker restarts; retrying it is the documented
    // way to finish the same transaction (its outcome is never left unknown).
    static void commit(KafkaProducer<byte[], byte[]> producer) {
        for (int attempt = 1; ; attempt++) {
            try {
                producer.commitTransaction();
                return;
            } catch (TimeoutException e) {
                if (attempt >= 20) throw e;
            }
        }
    }

    static void runPhase(
            String bootstrap, String topic, PrintWriter manifest, Map<String, String> p, int index)
            throws Exception {
        long records = num(p, "records", 1000);
        long txn = num(p, "txn", 0);
        long abortEvery = num(p, "abort_every", 0);
        long tombstoneEvery = num(p, "tombstone_every", 0);
        double rate = Double.parseDouble(p.getOrDefault("rate", "0"));
        boolean keys = num(p, "keys", 0) != 0;
        boolean headers = num(p, "headers", 0) != 0;
        Long tsOffset = p.containsKey("ts_offset_ms") ? Long.parseLong(p.get("ts_offset_ms")) : null;
        Random rng = new Random(num(p, "seed", 1) * 1000 + index);

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, p.getOrDefault("codec", "none"));
        props.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "300000");
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "300000");
        if (txn > 0) {
            props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "interop-" + topic + "-" + index);
            props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
        }
        long t0 = System.nanoTime();
        long sent = 0;
        long transactions = 0;
        long failures = 0;
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        try {
            if (txn > 0) producer.initTransactions();
            int partitions = producer.partitionsFor(topic).size();
            while ((records == 0 || sent < records) && !STOP.get()) {
                long n = txn > 0 ? txn : Math.min(500, records == 0 ? 500 : records - sent);
                if (records > 0) n = Math.min(n, records - sent);
                boolean abort = txn > 0 && abortEvery > 0 && transactions % abortEvery == abortEvery - 1;
                List<Future<RecordMetadata>> futures = new ArrayList<>();
                List<Boolean> tombstones = new ArrayList<>();
                try {
                    if (txn > 0) producer.beginTransaction();
                    for (long i = 0; i < n; i++, sent++) {
                        if (rate > 0) {
                            long due = t0 + (long) (sent * 1e9 / rate);
                            long wait = due - System.nanoTime();
                            if (wait > 0) Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                        }
                        boolean tomb = tombstoneEvery > 0 && sent % tombstoneEvery == tombstoneEvery - 1;
                        byte[] key = keys ? ("k" + sent).getBytes(StandardCharsets.UTF_8) : null;
                        byte[] value = tomb ? null : sample(rng);
                        Long ts = tsOffset == null ? null : System.currentTimeMillis() + tsOffset;
                        ProducerRecord<byte[], byte[]> rec =
                                new ProducerRecord<>(topic, (int) (sent % partitions), ts, key, value);
                        if (headers) {
                            rec.headers().add(new RecordHeader("source", "java".getBytes(StandardCharsets.UTF_8)));
                            rec.headers().add(new RecordHeader("seq", Long.toString(sent).getBytes(StandardCharsets.UTF_8)));
                        }
                        futures.add(producer.send(rec));
                        tombstones.add(tomb);
                    }
                    producer.flush(); // every record is in the log, also those of a transaction to abort
                    if (txn > 0) {
                        if (abort) producer.abortTransaction();
                        else commit(producer);
                    }
                } catch (KafkaException e) {
                    // A broker restart the client could not ride out: the batch's records that
                    // reached the log stay there; a transaction is aborted.
                    failures++;
                    System.err.println("batch failed: " + e);
                    if (txn > 0) {
                        abort = true;
                        try {
                            producer.abortTransaction();
                        } catch (KafkaException e2) {
                            // A new producer with the same transactional.id aborts it for us.
                            producer.close(Duration.ZERO);
                            producer = new KafkaProducer<>(props);
                            producer.initTransactions();
                        }
                    }
                }
                if (txn > 0) transactions++;
                for (int i = 0; i < futures.size(); i++) {
                    RecordMetadata md;
                    try {
                        md = futures.get(i).get();
                    } catch (ExecutionException e) {
                        continue; // never reached the log
                    }
                    String kind = abort ? "aborted" : tombstones.get(i) ? "tombstone" : "committed";
                    manifest.println(md.partition() + "," + md.offset() + "," + kind);
                }
                manifest.flush();
            }
        } finally {
            producer.close();
        }
        if (failures > 0) System.err.printf("phase %d: %d failed batches%n", index, failures);
        double seconds = (System.nanoTime() - t0) / 1e9;
        System.err.printf("phase %d: %d records, %d transactions in %.1fs%n", index, sent, transactions, seconds);
    }
}
