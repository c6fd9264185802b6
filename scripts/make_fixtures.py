#!/usr/bin/env python3
"""Write the hand-authored raw data fixtures under data/raw/.

Deterministic (random.Random(1234)), standard library only, no network.
All utterances, topics, personas and reasons below were written for this
project; nothing is copied from the public reference data.

Outputs
  data/raw/chats/wildchat_general.jsonl   WildChat-1M style chat logs
  data/raw/chats/wildchat_coding.jsonl
  data/raw/chats/tom_social.jsonl          theory-of-mind / social reasoning
  data/raw/thoughttrace/thoughttrace.jsonl ThoughtTrace style (reasons/reactions)
  data/raw/abcd/abcd_v1.1.json             ABCD v1.1 style (train/dev/test)
  data/raw/abcd/kb.json                    required action buttons per subflow
  data/raw/abcd/guidelines.json            agent guidelines with policy rules

Usage: python3 scripts/make_fixtures.py [--out DIR]   (default: <repo>/data/raw)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 1234

rng = random.Random(SEED)


def sha256(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------
# 1. WildChat-style chat logs
# ---------------------------------------------------------------------------

UA = {
    "win_chrome": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/113.0.0.0 Safari/537.36",
    "win_edge": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/115.0.0.0 Safari/537.36 Edg/115.0.1901.188",
    "win_firefox": "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:109.0) Gecko/20100101 Firefox/117.0",
    "mac_safari": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.4 Safari/605.1.15",
    "mac_chrome": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/116.0.0.0 Safari/537.36",
    "linux_firefox": "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/115.0",
    "iphone": "Mozilla/5.0 (iPhone; CPU iPhone OS 16_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.5 Mobile/15E148 Safari/604.1",
    "android": "Mozilla/5.0 (Linux; Android 13; SM-S911B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/114.0.0.0 Mobile Safari/537.36",
    "android_xiaomi": "Mozilla/5.0 (Linux; Android 12; M2101K6G) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/112.0.0.0 Mobile Safari/537.36",
}

# key: (made-up seed string for the hashed ip, country, state, accept-language, user agent)
CHAT_USERS = {
    "u01": ("198.51.100.23/lena-designer", "United States", "California", "en-US,en;q=0.9", "mac_safari"),
    "u02": ("203.0.113.77/tx-dev-marco", "United States", "Texas", "en-US,en;q=0.9", "win_chrome"),
    "u03": ("192.0.2.140/gdl-sofia", "Mexico", "Jalisco", "es-MX,es;q=0.9,en;q=0.8", "android"),
    "u04": ("198.51.100.201/muc-jonas", "Germany", "Bavaria", "de-DE,de;q=0.9,en-US;q=0.8,en;q=0.7", "win_firefox"),
    "u05": ("203.0.113.5/paris-camille", "France", "Île-de-France", "fr-FR,fr;q=0.9,en-US;q=0.8,en;q=0.7", "mac_chrome"),
    "u06": ("192.0.2.66/bj-wei", "China", "Beijing", "zh-CN,zh;q=0.9", "win_edge"),
    "u07": ("198.51.100.9/seoul-jiwoo", "South Korea", "Seoul", "ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7", "iphone"),
    "u08": ("203.0.113.150/sp-beatriz", "Brazil", "São Paulo", "pt-BR,pt;q=0.9,en-US;q=0.8,en;q=0.7", "android"),
    "u09": ("192.0.2.210/blr-rohan", "India", "Karnataka", "en-IN,en-GB;q=0.9,en-US;q=0.8,en;q=0.7", "win_chrome"),
    "u10": ("198.51.100.88/leeds-tom", "United Kingdom", "England", "en-GB,en;q=0.9", "mac_safari"),
    "u11": ("203.0.113.42/ott-jess", "Canada", "Ontario", "en-CA,en-US;q=0.9,en;q=0.8", "iphone"),
    "u12": ("192.0.2.12/nyc-dan", "United States", "New York", "en-US,en;q=0.9", "mac_chrome"),
    "u13": ("198.51.100.171/syd-kate", "Australia", "New South Wales", "en-AU,en;q=0.9", "win_edge"),
    "u14": ("203.0.113.99/sea-priya", "United States", "Washington", "en-US,en;q=0.9", "mac_chrome"),
    "u15": ("192.0.2.180/mad-alvaro", "Spain", "Madrid", "es-ES,es;q=0.9,en;q=0.8", "win_chrome"),
    "u16": ("198.51.100.60/lagos-tunde", "Nigeria", "Lagos", "en-GB,en-US;q=0.9,en;q=0.8", "android_xiaomi"),
    "u17": ("203.0.113.18/mnl-andrea", "Philippines", "Metro Manila", "en-US,en;q=0.9,fil;q=0.8", "android"),
    "u18": ("192.0.2.33/chi-kevin", "United States", "Illinois", "en-US,en;q=0.9", "linux_firefox"),
    "u19": ("198.51.100.120/msk-olga", "Russia", "Moscow", "ru-RU,ru;q=0.9,en-US;q=0.8,en;q=0.7", "win_chrome"),
    "u20": ("203.0.113.201/tyo-haruki", "Japan", "Tokyo", "ja-JP,ja;q=0.9,en-US;q=0.8,en;q=0.7", "iphone"),
    "u21": ("192.0.2.77/mia-carla", "United States", "Florida", "en-US,en;q=0.9", "iphone"),
    "u22": ("198.51.100.47/ams-sanne", "Netherlands", "North Holland", "nl-NL,nl;q=0.9,en-US;q=0.8,en;q=0.7", "mac_safari"),
    "u23": ("203.0.113.133/hn-minh", "Vietnam", "Hanoi", "vi-VN,vi;q=0.9,en-US;q=0.8,en;q=0.7", "android"),
    "u24": ("192.0.2.158/bos-rachel", "United States", "Massachusetts", "en-US,en;q=0.9", "win_firefox"),
    "u25": ("198.51.100.222/sg-wenhui", "Singapore", None, "en-SG,en;q=0.9,zh-CN;q=0.8", "mac_chrome"),
}

# (model, available from, available until) -- timestamps are drawn inside the window
CHAT_MODELS = [
    ("gpt-3.5-turbo-0301", "2023-04-10", "2023-06-26"),
    ("gpt-4-0314", "2023-04-10", "2023-11-05"),
    ("gpt-3.5-turbo-0613", "2023-06-27", "2024-01-31"),
    ("gpt-4-1106-preview", "2023-11-06", "2024-01-24"),
    ("gpt-4-0125-preview", "2024-01-25", "2024-04-08"),
    ("gpt-3.5-turbo-0125", "2024-02-01", "2024-04-30"),
    ("gpt-4-turbo-2024-04-09", "2024-04-09", "2024-04-30"),
]

SYS_DEFAULT = "You are a helpful assistant."


def C(user, lang, turns, system=None):
    """A chat conversation spec.

    turns: list of (user_text, assistant_text); either side may be a
    (text, language) tuple when that turn is not in the conversation language.
    """
    return {"user": user, "lang": lang, "turns": turns, "system": system}


GENERAL = [
    C("u01", "English", [
        ("Write a cover letter for a junior UX designer position at a fintech startup called Ledgerly. I have a bootcamp certificate (Springboard, 2022), about a year of freelance work, mostly small business websites, and before that I was a barista for 4 years which honestly taught me a lot about dealing with people.",
         """Dear Ledgerly Hiring Team,

I'm excited to apply for the Junior UX Designer position at Ledgerly. Personal finance is one of those areas where good design can genuinely change how people feel about their money, and I'd love to help build products that make it feel less intimidating.

I completed Springboard's UX Design program in 2022, where I worked through the full design process: user interviews, journey mapping, wireframing, prototyping in Figma, and usability testing. Since then I've spent a year freelancing for small businesses, redesigning websites for a local bakery, a physiotherapy clinic and a nonprofit food bank. On every project I ran quick usability sessions with real customers, and for the clinic the new online booking flow noticeably reduced the number of bookings made by phone.

Before moving into design, I spent four years as a barista. It might sound unrelated, but it taught me how to read people quickly, stay calm when things get hectic, and notice the small moments of friction that make or break an experience. I bring that same attention to every interface I design.

I'd be thrilled to bring my curiosity, empathy and passion for pixels to Ledgerly's team. Thank you for considering my application. I'd welcome the chance to talk about how I can contribute.

Sincerely,
[Your Name]"""),
        ("make it better",
         """Sure! Here's a revised version with a stronger opening, more concrete detail, and a slightly more confident tone:

Dear Ledgerly Hiring Team,

Most people don't enjoy opening their banking app. I want to help change that, which is why I'm applying for the Junior UX Designer role at Ledgerly.

Since finishing Springboard's UX Design program in 2022, I've spent a year as a freelance designer for small businesses. I redesigned the booking flow for a physiotherapy clinic, rebuilt the donation page for a food bank, and tested every change with the people who actually use them. That habit of testing early and often is something I'd bring to Ledgerly from day one.

Before design, I worked for four years as a barista. Serving hundreds of customers a day taught me to notice confusion before anyone says a word, and to fix problems quickly without losing my cool. Those instincts translate directly to designing for people who are often stressed about money.

I'd love to talk about how I can help Ledgerly's products feel simpler and more trustworthy, and I'm excited to bring my passion for pixels to your team.

Best regards,
[Your Name]

If you tell me what you'd like improved specifically (tone, length, or which experience to emphasize), I can tailor it further."""),
        ("shorter. and less cheesy, the 'passion for pixels' line is cringe",
         """Fair point. Here's a leaner version without the fluff:

Dear Ledgerly Hiring Team,

I'm applying for the Junior UX Designer role. I finished Springboard's UX program in 2022 and have since spent a year freelancing, redesigning sites for small businesses and testing each one with real users.

Before design, I worked four years as a barista, which taught me to spot friction fast and stay calm under pressure, both useful when designing for people's money.

I'd welcome the chance to talk about how I can help make Ledgerly's products simpler and more trustworthy.

Best regards,
[Your Name]"""),
    ]),
    C("u01", "English", [
        ("""rewrite this so it sounds professional, its going to my manager and the whole design team:

hey guys so the launch is pushed AGAIN bc design wasnt done with the onboarding screens, we'll prob ship next thurs. sorry lol""",
         """Here's a more professional version:

"Hi team,

A quick update: the launch has moved to next Thursday. The onboarding screens need a little more time to be finalized, and we want to make sure they're right before release. Apologies for the change in schedule. I'll share an update if anything shifts.

Thanks for your patience,
[Your Name]"

I softened the part about design causing the delay so it doesn't read as assigning blame in front of the whole team. If you want to be more specific, you could add a line listing what is still outstanding and who owns it."""),
    ]),
    C("u03", "Spanish", [
        ("Hola! me puedes ayudar a planear un viaje de 5 días a Oaxaca? no tengo mucho presupuesto, como 8 mil pesos sin contar el camión",
         """¡Claro! Oaxaca es perfecta para viajar con poco presupuesto. Aquí tienes una propuesta de 5 días con un estimado de gastos:

**Día 1 – Centro histórico**
- Llegada y check-in en un hostal del centro (300–450 MXN por noche).
- Paseo por el Zócalo, la Catedral y el andador Macedonio Alcalá.
- Cena en el mercado 20 de Noviembre, en el pasillo de carnes asadas (unos 150 MXN).

**Día 2 – Monte Albán**
- Camión turístico desde el centro (alrededor de 100 MXN ida y vuelta).
- Entrada a la zona arqueológica (aprox. 95 MXN).
- Por la tarde, el Templo de Santo Domingo y el Jardín Etnobotánico (solo se entra con visita guiada).

**Día 3 – Hierve el Agua y Mitla**
- Tour compartido (350–450 MXN) que suele incluir el Árbol del Tule, Teotitlán del Valle, Mitla y Hierve el Agua.
- Lleva traje de baño y bloqueador.

**Día 4 – Pueblos artesanos**
- San Bartolo Coyotepec (barro negro) y San Martín Tilcajete (alebrijes) en colectivo.
- Comida corrida en una fonda: 80–120 MXN.

**Día 5 – Día tranquilo**
- Desayuno de tlayudas o chocolate con pan de yema.
- Compras de mezcal o chocolate en el mercado Benito Juárez antes de irte.

**Presupuesto estimado**
- Hospedaje (4 noches): 1,600 MXN
- Comida: 1,800 MXN
- Tours y transporte local: 1,200 MXN
- Entradas: 300 MXN
- Extras y compras: 1,500 MXN
- **Total: ~6,400 MXN**, así que te queda margen.

¿Viajas en temporada alta (Guelaguetza o Día de Muertos)? En esas fechas los precios suben bastante y conviene reservar con tiempo."""),
        ("y si voy con mi abuela? ella no puede caminar mucho",
         """Buena pregunta, en ese caso conviene hacer algunos cambios:

- **Hospedaje:** busca un hotel pequeño con habitación en planta baja o con elevador, lo más cerca posible del Zócalo. Cuesta un poco más (600–800 MXN la noche), pero les ahorra caminatas.
- **Monte Albán:** tiene muchas escaleras y terreno irregular. Pueden quedarse en la explanada principal o cambiarlo por el Museo de las Culturas en Santo Domingo, que tiene rampas y elevador.
- **Hierve el Agua:** la bajada a las cascadas es empinada. Mejor elige un tour que se enfoque en el Tule y Teotitlán, donde casi todo está a nivel de calle.
- **Transporte:** usen taxi para los trayectos cortos dentro de la ciudad (50–80 MXN) en lugar de caminar entre un punto y otro.
- **Ritmo:** planeen una sola actividad fuerte por día y dejen las tardes libres para descansar.

Con estos ajustes el presupuesto sube a unos 7,500 MXN, todavía dentro de lo que tienes. ¡Que lo disfruten mucho!"""),
    ]),
    C("u03", "Spanish", [
        ("escríbeme un mensaje de cumpleaños para mi mamá, cumple 60",
         """¡Claro! Aquí tienes una opción:

"Mamá, hoy cumples 60 años y no encuentro palabras suficientes para agradecerte todo lo que has hecho por mí. Gracias por tu paciencia infinita, por tus consejos (incluso los que no quise escuchar) y por enseñarme con tu ejemplo lo que significa querer sin condiciones. Que esta nueva década venga llena de salud, viajes, risas y todo lo que te haga feliz. Te quiero muchísimo. ¡Feliz cumpleaños!"

¿Lo quieres más formal, más divertido o más corto?"""),
        ("más corto y que no suene tan cursi jaja",
         "¡Va! \"¡Feliz 60, mamá! Gracias por aguantarme todos estos años. Que sigas igual de guapa y de mandona. Te quiero.\""),
    ]),
    C("u04", "German", [
        ("Kannst du mir eine Kündigung für meinen Fitnessstudio-Vertrag schreiben? Mitgliedsnummer 48213, das Studio heißt FitWerk Süd, ich will zum nächstmöglichen Termin kündigen.",
         """Gerne, hier ist ein Vorschlag:

---
[Vorname Nachname]
[Straße Hausnummer]
[PLZ Ort]

FitWerk Süd
[Adresse des Studios]

[Ort], [Datum]

**Kündigung meiner Mitgliedschaft – Mitgliedsnummer 48213**

Sehr geehrte Damen und Herren,

hiermit kündige ich meinen Mitgliedschaftsvertrag fristgerecht zum nächstmöglichen Zeitpunkt.

Bitte senden Sie mir eine schriftliche Bestätigung der Kündigung unter Angabe des Beendigungsdatums zu. Einer Abbuchung von Beiträgen über das Vertragsende hinaus widerspreche ich hiermit.

Mit freundlichen Grüßen

[Unterschrift]
[Vorname Nachname]
---

Tipp: Schau in deinem Vertrag nach der Kündigungsfrist, damit du weißt, wann die Mitgliedschaft tatsächlich endet."""),
        ("Danke. Muss ich das per Einschreiben schicken oder reicht eine Mail?",
         """Das hängt von deinem Vertrag ab. Bei den meisten neueren Verträgen reicht die Textform, also auch eine E-Mail, wenn im Vertrag nichts Strengeres wirksam vereinbart ist. Anbieter, die Verträge online abschließen, müssen außerdem einen Kündigungsbutton auf ihrer Website anbieten.

Wichtig ist vor allem, dass du nachweisen kannst, dass die Kündigung rechtzeitig angekommen ist. Entweder:
- Einschreiben mit Rückschein, oder
- E-Mail bzw. Kündigungsbutton, und du speicherst die Eingangsbestätigung.

Wenn du auf Nummer sicher gehen willst, mach beides."""),
    ]),
    C("u05", "French", [
        ("Corrige les fautes dans ce texte stp : « Je vous remercie pour votre reponse rapide. Comme convenu, je vous envois les documents demander en pièce jointe. N'hésiter pas à me contacter si vous avez des questions suplémentaires. »",
         """Voici le texte corrigé :

« Je vous remercie pour votre réponse rapide. Comme convenu, je vous envoie les documents demandés en pièce jointe. N'hésitez pas à me contacter si vous avez des questions supplémentaires. »

Corrections :
- *reponse* → **réponse** (accent aigu)
- *envois* → **envoie** (verbe envoyer, 1re personne du singulier)
- *demander* → **demandés** (participe passé accordé avec « documents »)
- *N'hésiter* → **N'hésitez** (impératif, 2e personne du pluriel)
- *suplémentaires* → **supplémentaires** (deux « p »)"""),
    ]),
    C("u05", "French", [
        ("Quels sont les meilleurs endroits pour voir des aurores boréales en février ? Je pars de Lyon et je préfère éviter les trucs trop touristiques",
         """Février est une très bonne période : les nuits sont encore longues et le ciel souvent plus dégagé qu'en décembre. Quelques options moins fréquentées que Tromsø ou Rovaniemi :

1. **Abisko (Suède)** – réputé pour son « trou bleu », une zone où le ciel reste souvent dégagé grâce aux montagnes. Accessible en train de nuit depuis Stockholm.
2. **Inari et Kilpisjärvi (Laponie finlandaise)** – très peu de pollution lumineuse, beaucoup de chalets isolés. Vol vers Ivalo via Helsinki.
3. **Île de Senja (Norvège)** – une alternative sauvage à Tromsø, avec des fjords spectaculaires et beaucoup moins de bus touristiques.
4. **Nord de l'Islande (autour d'Akureyri ou Mývatn)** – moins de monde que la région de Reykjavik, et des sources chaudes en prime.

Conseils : prévois au moins 3 ou 4 nuits sur place pour maximiser tes chances, consulte les prévisions d'activité aurorale et de couverture nuageuse, et évite la pleine lune si possible."""),
        ("Et pour le budget, c'est quoi le moins cher ?",
         """En général, la Laponie finlandaise et Abisko sont les options les plus raisonnables :

- **Abisko** : train de nuit depuis Stockholm (assez abordable si tu réserves tôt), auberge de la STF ou chambre partagée. Compte environ 900 à 1 200 € pour 5 jours au départ de Lyon, vols compris.
- **Inari** : un peu plus cher pour le vol, mais les chalets sont moins chers à plusieurs. Environ 1 000 à 1 400 €.
- **Senja** et **l'Islande** sont souvent les plus chères (location de voiture quasi obligatoire, repas coûteux).

Pour économiser : pars en semaine, loge en cuisine partagée, et évite les excursions « chasse aux aurores » en bus ; à Abisko, il suffit souvent de marcher 10 minutes hors du village."""),
    ]),
    C("u06", "Chinese", [
        ("帮我写一段关于秋天的短文，三百字左右，要有画面感",
         """秋天是从一阵风开始的。某个清晨推开窗，空气忽然变得清爽，带着一点凉意，像是有人在耳边轻轻提醒：夏天走远了。

街边的梧桐叶一片片变黄，风一吹，就打着旋儿落下来，铺在人行道上，踩上去沙沙作响。阳光不再刺眼，斜斜地照在老墙上，把树影拉得很长。公园里，银杏树像被点燃了一样，金黄一片，孩子们捧起落叶往天上抛，笑声在空气里荡开。

傍晚的天空特别高，云被夕阳染成橘红色，远处有一群大雁排成人字往南飞。路边的小摊上，糖炒栗子的香味飘了很远，卖烤红薯的大爷掀开炉盖，热气腾腾。

秋天不像春天那样热闹，也不像夏天那样张扬，它安安静静的，却把一年里最温柔的颜色都留了下来。"""),
        ("再加一点关于家乡的内容，我老家在湖南",
         """好的，加入了家乡湖南的元素：

秋天是从一阵风开始的。某个清晨推开窗，空气忽然变得清爽，带着一点凉意，像是有人在耳边轻轻提醒：夏天走远了。

城市里的梧桐叶一片片变黄，踩上去沙沙作响。可每到这个时候，我总会想起湖南老家的秋天。

老家的秋天是金色的。稻田里的稻子沉甸甸地弯着腰，风吹过，一层层稻浪翻滚。奶奶在院子里晒辣椒，红彤彤地铺满竹筛，空气里都是呛人的辣味。屋后的橘子树挂满了果子，我和堂弟爬上去摘，一边摘一边偷吃，酸得直皱眉。

傍晚，炊烟从屋顶升起，灶台上炖着腊肉和萝卜，香味飘满整个村子。大人们坐在门口聊天，远处的山慢慢变成深蓝色。

如今在外地生活，每到秋天，我都会想念那片稻田、那串红辣椒，还有奶奶喊我回家吃饭的声音。"""),
    ]),
    C("u06", "Chinese", [
        ("""把这封邮件翻译成中文，语气要正式一点：

Dear Mr. Chen,
Thank you for meeting with us last Tuesday. As discussed, we will send the revised quotation by Friday. Please let us know if your team has any further requirements.
Best regards,
Anna""",
         """尊敬的陈先生：

您好！感谢您上周二抽出宝贵时间与我们会面。按照会上商定的内容，我们将于本周五前将修订后的报价单发送给您。如贵方团队还有其他需求，敬请随时告知。

此致
敬礼

Anna"""),
    ]),
    C("u07", "Korean", [
        ("""자기소개서 첫 문단 좀 다듬어 줄래?

저는 어릴 때부터 사람들과 이야기하는 것을 좋아했고 그래서 마케팅에 관심을 가지게 되었습니다. 대학교에서 광고 동아리 활동을 하면서 여러 캠페인을 기획했습니다.""",
         """물론이죠. 조금 더 구체적이고 자연스럽게 다듬어 봤어요:

"사람들의 마음을 움직이는 이야기에 늘 관심이 많았습니다. 이 관심은 자연스럽게 마케팅에 대한 열정으로 이어졌고, 대학 시절 광고 동아리에서 다양한 캠페인을 직접 기획하고 실행하며 아이디어가 실제 반응으로 이어지는 과정을 경험했습니다."

포인트:
- '어릴 때부터 좋아했다'는 흔한 표현이라 조금 더 인상적인 문장으로 바꿨어요.
- 단순히 '기획했다'보다 '기획하고 실행했다'로 바꿔서 주도성을 강조했어요."""),
        ("좀 더 자신감 있게 써줘. 그리고 숫자도 넣어줘",
         """좋아요. 성과를 숫자로 보여주는 버전이에요 (괄호 안 숫자는 실제 경험에 맞게 바꿔 주세요):

"저는 사람의 마음을 움직이는 메시지를 만드는 사람입니다. 대학 광고 동아리에서 (4)개의 캠페인을 기획·실행했고, 그중 교내 환경 캠페인은 SNS 팔로워를 (3주) 만에 (1,200)명 늘리며 참여율 (35%)를 기록했습니다. 이 경험을 통해 데이터로 검증되는 마케팅의 힘을 확신하게 되었습니다."

숫자가 정확하지 않다면 과장하지 말고 실제 수치를 넣는 게 면접에서도 훨씬 유리해요."""),
    ]),
    C("u08", "Portuguese", [
        ("Quais documentos preciso pra tirar o passaporte no Brasil?",
         """Para o passaporte comum, normalmente você vai precisar de:

1. **Documento de identidade** com foto (RG, CNH ou outro documento oficial).
2. **CPF**.
3. **Título de eleitor** e comprovante de que votou na última eleição (ou justificou/pagou a multa), para maiores de 18 anos.
4. **Certificado de reservista**, para homens entre 18 e 45 anos.
5. **Passaporte anterior**, se você já teve um.
6. **Comprovante de pagamento da GRU** (a taxa).

O processo é: preencher o formulário no site da Polícia Federal, pagar a GRU e agendar o atendimento presencial, onde tiram sua foto e digitais."""),
        ("e quanto custa?",
         """A taxa do passaporte comum é de aproximadamente R$ 257,25, paga pela GRU gerada no próprio site da Polícia Federal depois de preencher o formulário. Se for a emissão em caráter de urgência ou em caso de perda/roubo do anterior, pode haver valores diferentes.

Como esse valor pode ser atualizado, confirme sempre no site oficial da Polícia Federal antes de pagar."""),
    ]),
    C("u09", "English", [
        ("I got an offer for a data analyst role, 9 LPA. I was expecting at least 11. How do I negotiate without sounding greedy? This is my first job switch",
         """Negotiating is completely normal, and most companies expect it. A polite counter rarely costs you an offer. Here's how to approach it:

**1. Anchor on market data, not on need.** Look up salary ranges for data analysts with your experience in your city (Glassdoor, AmbitionBox, LinkedIn, friends in similar roles). If 11 LPA is in range, you have a solid basis.

**2. Express enthusiasm first.** Make it clear you want the job; you're discussing terms, not threatening to walk away.

**3. Give a specific number.** Ask for slightly above your target (for example 11.5) so there's room to meet in the middle.

**4. Justify with value.** Mention the skills they specifically need: SQL, Python, dashboarding, any domain experience.

A sample line for the call:
> "I'm really excited about the role and the team. Based on my experience with SQL and Power BI and what similar roles pay in Bengaluru, I was hoping for something closer to 11.5 LPA. Is there flexibility on the fixed component?"

Then pause and let them respond."""),
        ("what if they say this is the max for the band",
         """That's common, and it doesn't have to end the conversation. If the fixed salary truly can't move, negotiate other parts of the package:

- **Joining bonus:** a one-time amount to bridge the gap.
- **Early salary review:** ask for a formal review at 6 months instead of 12, with the criteria written down.
- **Variable pay or ESOPs:** if the company offers them.
- **Notice-period buyout** if your current employer requires a long notice period.
- **Learning budget, WFH days, or extra leave.**

You could say:
> "I understand the band is fixed. Would it be possible to add a joining bonus or move my first appraisal to six months?"

If nothing moves at all, decide whether the role is worth it for the learning and the brand on your CV. For a first switch, it sometimes is."""),
        ("ok thanks. can you write the email",
         """Sure, here's a short, polite email you can adapt:

Subject: Offer discussion – Data Analyst role

Hi [Recruiter's name],

Thank you again for the offer for the Data Analyst position. I'm genuinely excited about the opportunity to join [Company] and work with the analytics team.

Having reviewed the offer, I wanted to ask whether there is flexibility on the compensation. Based on my experience with SQL, Python and Power BI, and current market ranges for similar roles in Bengaluru, I was hoping for a fixed CTC closer to 11.5 LPA.

If the fixed component cannot be revised, I'd be happy to discuss alternatives such as a joining bonus or an early salary review at six months.

Looking forward to hearing from you.

Best regards,
[Your Name]"""),
    ]),
    C("u10", "English", [
        ("Plan 10 days in Japan for me and my partner in mid April. We fly into Tokyo and out of Osaka. We like food, walking, and old temples, not really into shopping or nightlife.",
         """Here's a relaxed 10-day route that works well for food, walking and temples:

**Days 1–3: Tokyo**
- Day 1: Arrive, check in around Asakusa. Evening walk to Sensō-ji when it's quiet and lit up.
- Day 2: Yanaka neighbourhood (old temples, cemetery walk, small shops), then Ueno Park. Dinner in an izakaya.
- Day 3: Meiji Shrine early, walk through Yoyogi Park, afternoon at Kiyosumi Gardens. Try a depachika food hall.

**Day 4: Nikko (day trip)**
- Tōshō-gū shrine complex and the Kanmangafuchi Abyss walking path.

**Days 5–8: Kyoto**
- Day 5: Shinkansen to Kyoto. Afternoon in Higashiyama: Kiyomizu-dera, Sannenzaka.
- Day 6: Fushimi Inari (go early), then Tōfuku-ji.
- Day 7: Arashiyama bamboo grove, Tenryū-ji, Ōkōchi Sansō villa.
- Day 8: Philosopher's Path, Ginkaku-ji, Nanzen-ji. Cooking class in the evening.

**Day 9: Nara (day trip)**
- Tōdai-ji, Kasuga Taisha, Nara Park.

**Day 10: Osaka**
- Kuromon Market and Dōtonbori for food, then fly out.

Get a 7-day JR Pass only if you do Nikko plus the long Shinkansen legs; otherwise individual tickets may be cheaper."""),
        ("we hate crowds tho. is april a bad idea?",
         """Mid-April is the tail end of cherry blossom season, so popular spots (especially in Kyoto) will be busy. It's not a bad idea, but you'll want to plan around the crowds:

- **Go early.** Fushimi Inari, Kiyomizu-dera and Arashiyama are calm before 8am and packed by 10.
- **Swap a Kyoto day for somewhere less visited.** Kanazawa is a great choice: beautiful gardens (Kenroku-en), an old samurai district and excellent seafood, with far fewer tour groups.
- **Skip Nara at weekends**, or do it on a weekday morning.
- **Book accommodation now.** Kyoto hotels fill up early in April.

Late April (before Golden Week starts on the 29th) is generally quieter than the first half of the month."""),
        ("ok swap in kanazawa and drop nara. can you put it in a table",
         """| Day | Base | Plan |
|---|---|---|
| 1 | Tokyo | Arrive, Asakusa, evening at Sensō-ji |
| 2 | Tokyo | Yanaka walk, Ueno Park, izakaya dinner |
| 3 | Tokyo | Meiji Shrine early, Yoyogi Park, Kiyosumi Gardens |
| 4 | Tokyo | Day trip to Nikko: Tōshō-gū, Kanmangafuchi Abyss |
| 5 | Kanazawa | Hokuriku Shinkansen to Kanazawa, Higashi Chaya district |
| 6 | Kanazawa | Kenroku-en early, Nagamachi samurai district, Ōmichō market |
| 7 | Kyoto | Train to Kyoto, afternoon in Higashiyama |
| 8 | Kyoto | Fushimi Inari at 7am, Tōfuku-ji |
| 9 | Kyoto | Arashiyama early, Philosopher's Path in the afternoon |
| 10 | Osaka | Kuromon Market, Dōtonbori, fly out |"""),
        ("perfect cheers",
         "You're welcome! Have a brilliant trip, and book the Kanazawa ryokan early; mid-April fills up fast."),
    ]),
    C("u10", "English", [
        ("whats a good gift for my dad who likes fishing, budget about 50 quid",
         """A few ideas around £50:

- **A good tackle box or organiser** (Plano or Fox) if his current one is a mess.
- **Polarised sunglasses**: they cut glare off the water so you can actually see fish. Decent pairs start around £30–50.
- **A head torch** for early mornings or night fishing.
- **A fishing day ticket or a session at a well-stocked lake** you could go to together.
- **A personalised fly box or lure box** engraved with his name.
- **A waterproof flask and a folding chair** if he does long sessions on the bank.

If you know whether he does coarse, sea or fly fishing, I can narrow it down."""),
    ]),
    C("u11", "English", [
        ("""This is my maid of honor speech, make it better:

Hi everyone, I'm Jess, Emily's sister. I've known Emily her whole life obviously. She's always been the responsible one. When she met Dan, we all knew he was the one because she actually let him pick the restaurant. Dan, thank you for making my sister so happy. Please raise your glasses to Emily and Dan.""",
         """Here's a polished version that keeps your voice and the restaurant joke:

"Hi everyone, I'm Jess, Emily's younger sister. I've known Emily my entire life, which means I've had a front-row seat to her being the responsible one: the one with the plan, the spreadsheet, and the backup plan for the spreadsheet.

So when she met Dan, we noticed something was different. For the first time in recorded history, Emily let someone else pick the restaurant. That's when we knew.

Dan, thank you for making my sister laugh the way you do, and for loving her exactly as she is, spreadsheets and all.

Please raise your glasses: to Emily and Dan!\""""),
        ("hmm still not it",
         """Got it. Can you tell me what feels off? For example: too short, not funny enough, not emotional enough, or it doesn't sound like you?

In the meantime, here's a different take that leans on a memory rather than jokes:

"When we were kids, Emily used to make me practice fire drills in our bedroom. She'd time me. She was nine. That's my sister: always looking out for everyone, even when nobody asked.

Dan, you're the first person I've seen look out for her the same way. Thank you for that.

To Emily and Dan.\""""),
        ("idk just more emotional i guess. like people should cry a little",
         """Here's a version built to land emotionally:

"Hi everyone, I'm Jess, Emily's sister.

Emily has been taking care of me since before I can remember. When I was scared of the dark, she left her light on. When I failed my driving test twice, she drove me to the third one and waited in the car park for an hour. When Mum got sick, she was the one who held everything together, and I don't think she ever let herself fall apart.

So the thing I wished for her, more than anything, was someone who would take care of her for a change.

Dan, the first time I saw you bring her tea without her asking, I went home and cried a little. Because I knew she'd finally found it.

Emily, you've spent your whole life making sure everyone else was okay. Today, we're all here for you.

Please raise your glasses to my sister and to Dan."

Swap in real memories where you can. Specific details are what make people tear up."""),
    ]),
    C("u12", "English", [
        ("""summarize this in 3 bullet points. quick.

A two-year study of about 1,600 employees at a large travel company found that staff who worked from home two days a week were just as productive and just as likely to be promoted as those who came into the office every day. The hybrid workers were also about a third less likely to quit, with the biggest effect among women, non-managers and employees with long commutes. Managers initially predicted that hybrid work would hurt productivity, but by the end of the experiment most had changed their minds. The company has since rolled out the hybrid policy to all eligible staff.""",
         """- Working from home two days a week didn't hurt productivity or promotions.
- Hybrid workers were about a third less likely to quit, especially women, non-managers and long commuters.
- Managers were sceptical at first but changed their minds; the company made hybrid work permanent.
- The study followed around 1,600 employees for two years."""),
        ("I said 3 bullets not 4. can you read",
         """Sorry about that. Here are three:

- Two days a week at home didn't hurt productivity or promotions.
- Hybrid staff were about a third less likely to quit, especially women, non-managers and long commuters.
- Initially sceptical managers came around, and the company made hybrid work permanent."""),
    ]),
    C("u13", "English", [
        ("I need to make lasagna for 8 people this Saturday and two of them are vegan and one is gluten free. Can I make one lasagna that works for everyone or do I need separate ones?",
         """You can absolutely make one lasagna that works for everyone. The trick is choosing components that are naturally vegan and gluten free and still taste indulgent.

**Ingredients (one large tray, serves 8)**
- 12–15 gluten-free lasagna sheets (check they're egg-free)
- Lentil and mushroom ragù: 2 cups dried brown lentils, 500 g mushrooms (finely chopped), 1 onion, 3 garlic cloves, 2 carrots, 2 tins crushed tomatoes, 2 tbsp tomato paste, dried oregano, a splash of red wine (optional)
- Cashew béchamel: 1½ cups soaked cashews, 2 cups unsweetened oat or soy milk, 2 tbsp nutritional yeast, 1 tbsp lemon juice, nutmeg, salt
- 2 large handfuls of spinach
- Vegan mozzarella for the top (optional)

**Method**
1. Cook the ragù for 35–40 minutes until thick. It should be drier than a normal bolognese because gluten-free sheets release less starch.
2. Blend the béchamel ingredients until silky.
3. Layer: ragù, sheets, béchamel, spinach; repeat 3–4 times; finish with béchamel and cheese.
4. Cover with foil and bake at 190 °C for 35 minutes, uncover and bake 15 more.

Let it rest for 15 minutes before cutting so the layers hold together."""),
        ("how far ahead can i make it",
         """You have a few options:

- **Assemble up to 2 days ahead**, cover tightly and keep it in the fridge unbaked. Add 10–15 minutes to the covered baking time since it goes in cold.
- **Make the ragù and béchamel up to 3 days ahead** and assemble on the day, which gives the best texture with gluten-free pasta.
- **Freeze the assembled, unbaked lasagna** for up to 2 months. Thaw overnight in the fridge before baking.

Gluten-free sheets can go a bit soft if they sit in sauce for too long, so if you have the choice, 1 day ahead is the sweet spot."""),
    ]),
    C("u14", "English", [
        ("explain inflation like im 10",
         """Imagine your favourite ice cream costs $2 today. Next year, the same ice cream costs $2.20. The ice cream didn't get bigger or better; your money just buys a little less than before. That's inflation: prices slowly going up over time.

Why does it happen? A few reasons:
- **More money, same stuff.** If everyone suddenly has more pocket money but the shop has the same amount of ice cream, the shop can raise prices and people will still buy.
- **Things cost more to make.** If milk, sugar or the shop's electricity get more expensive, the ice cream price goes up too.

A little inflation is normal. But if prices rise really fast, your savings in the piggy bank buy less and less, which is why grown-ups worry about it."""),
    ], system=SYS_DEFAULT),
    C("u15", "Spanish", [
        ("Necesito escribir un email formal a mi casero porque hay humedad en el dormitorio desde hace dos meses y no me hace caso por WhatsApp. Quiero que quede constancia.",
         """Aquí tienes una propuesta. Te recomiendo enviarlo por email y, si no responde, repetirlo por burofax:

---
Asunto: Comunicación de humedad en la vivienda de [dirección] – solicitud de reparación

Estimado Sr./Sra. [Apellido]:

Me pongo en contacto con usted como arrendatario/a de la vivienda situada en [dirección completa], en virtud del contrato firmado el [fecha].

Le comunico que desde el pasado [fecha aproximada] existe un problema de humedad en el dormitorio principal, que ha provocado manchas de moho en la pared y el techo. Se lo he trasladado en varias ocasiones por WhatsApp (los días [fechas]) sin haber recibido respuesta ni solución.

De acuerdo con la Ley de Arrendamientos Urbanos, corresponde al arrendador realizar las reparaciones necesarias para conservar la vivienda en condiciones de habitabilidad. Por ello, le solicito que se realice una revisión y la reparación correspondiente en un plazo máximo de 15 días desde la recepción de este correo.

Adjunto fotografías del estado actual.

Quedo a la espera de su respuesta.

Atentamente,
[Nombre y apellidos]
[DNI]
[Teléfono]
---"""),
        ("¿Puedo dejar de pagar el alquiler hasta que lo arregle?",
         """No te lo recomiendo. Aunque el casero esté incumpliendo su obligación de reparar, dejar de pagar el alquiler por tu cuenta puede darle motivo para iniciar un desahucio por impago, y eso te pondría en una posición mucho peor.

Lo que sí puedes hacer:
1. **Dejar constancia formal** (este email y, si no responde, un burofax con certificación de contenido).
2. **Reunir pruebas**: fotos con fecha, informes, incluso un informe de un técnico si es posible.
3. **Pedir una rebaja del alquiler o la reparación por vía judicial** si el problema afecta a la habitabilidad.
4. **Consultar con una asociación de inquilinos o la oficina de consumo** de tu comunidad autónoma; muchas ofrecen asesoramiento gratuito.

Si la humedad afecta a tu salud, guarda también cualquier informe médico relacionado."""),
    ]),
    C("u16", "English", [
        ("I want to start a poultry farm in Ogun state with 500 broilers. Give me a simple business plan outline",
         """Here's a simple outline you can build on:

**1. Summary**
- 500-bird broiler farm in Ogun State, 6–8 week production cycles, selling live birds and dressed chicken to local markets, restaurants and households.

**2. Setup**
- Pen: about 100 m² of deep-litter housing with good ventilation.
- Equipment: feeders, drinkers, brooder heaters (charcoal or gas), wood shavings, a small generator or solar for lighting.

**3. Production plan**
- Buy day-old chicks from a reputable hatchery.
- Brooding weeks 1–2, starter feed weeks 1–3, finisher feed weeks 4–6.
- Vaccination schedule (Gumboro, Newcastle/Lasota) and a vet contact.

**4. Market**
- Target festive periods (Christmas, Easter, Sallah) when prices peak.
- Pre-sell to 3–5 restaurants or caterers.

**5. Costs (per cycle)**
- Chicks, feed, drugs/vaccines, litter, labour, transport, fuel. Feed is usually 60–70% of the total.

**6. Revenue**
- Birds sold × average selling price, minus a mortality allowance of around 5%.

**7. Risks**
- Disease outbreaks, feed price increases, power supply, theft.

Would you like me to turn the costs section into a table you can fill with current prices?"""),
        ("what about feed cost, it has increased a lot this year",
         """Feed is the biggest line in the budget, so it's worth calculating carefully. As a rule of thumb, a broiler eats about 4–4.5 kg of feed over a 6-week cycle.

For 500 birds:
- Total feed ≈ 500 × 4.5 kg = 2,250 kg ≈ **90 bags of 25 kg**
- Roughly 30% starter, 70% finisher

Then: total feed cost = (starter bags × starter price) + (finisher bags × finisher price). Plug in the prices from your nearest distributor, because they vary a lot by brand and location.

Ways to manage rising feed prices:
- Buy in bulk with other farmers in a cooperative.
- Use feeders that reduce spillage (wasted feed can be 5–10%).
- Avoid overstocking beyond 6–7 weeks; feed conversion gets worse as birds get older.
- Some farmers mix part of their own finisher feed, but only do this with a proper formulation and quality ingredients."""),
        ("ok thanks", "You're welcome, and good luck with the farm! If you'd like, I can help you set this up as a simple spreadsheet so you can update prices as they change."),
    ]),
    C("u17", "English", [
        ("caption for my beach pic in la union",
         """Here are a few options:

1. "Salt in the air, sand in my hair."
2. "La Union state of mind."
3. "Catching waves and sunsets."
"""),
        ("more",
         """Sure:

4. "Vitamin sea, La Union edition."
5. "Weekend plans: sun, surf, repeat."
6. "Found my happy place up north."
7. "Life's better in flip-flops."
8. "Golden hour in San Juan." """),
        ("shorter", "- \"Sun. Sea. Repeat.\"\n- \"Elyu mode.\"\n- \"Salty and happy.\"\n- \"Wave hello.\""),
        ("with emojis", "- \"Sun. Sea. Repeat. ☀️🌊\"\n- \"Elyu mode 🏄‍♀️\"\n- \"Salty and happy 🧂😊\"\n- \"Wave hello 👋🌊\""),
        ("ok thanks!!", "Enjoy La Union! 🌅"),
    ]),
    C("u18", "English", [
        ("Write a poem about my grandmother who passed away last month. She loved gardening, especially tomatoes, and always hummed old hymns while cooking. Her name was Ruth.",
         """**For Ruth**

Her garden still remembers her,
the tomato vines lean toward the gate
as if she's only stepped inside
and will be back before it's late.

She knew the soil by touch alone,
which plants wanted sun, which wanted shade,
and every summer, red and full,
she gave away the best she made.

Her kitchen hummed with old, slow hymns,
"Abide with Me," half under breath,
the steam, the onions, and her voice,
a song that had no fear of death.

We'll plant the seeds she saved last fall,
we'll learn the tunes she used to hum,
and every August, in the heat,
we'll taste the summers she's become.

I'm so sorry for your loss. If you'd like, I can adjust the poem with more specific memories, or shorten it for a card or a eulogy."""),
    ]),
    C("u19", "Russian", [
        ("Как вежливо отказать коллеге, который постоянно просит помочь с его задачами? Не хочу испортить отношения.",
         """Отказывать вежливо вполне возможно, если говорить спокойно и конкретно. Несколько подходов:

1. **Сошлитесь на свою загрузку, а не на нежелание.**
   «Сейчас не смогу, у меня горит отчёт до пятницы. Давай посмотрим на следующей неделе?»

2. **Предложите альтернативу.**
   «Сам сделать не успею, но могу скинуть шаблон, по которому я это делал».

3. **Ограничьте помощь по времени.**
   «Могу выделить 15 минут после обеда, чтобы разобраться вместе».

4. **Если просьбы систематические, поговорите прямо.**
   «Я заметил, что часто помогаю тебе с задачами, и из-за этого не успеваю свои. Давай договоримся, что ты сначала пробуешь сам, а я подключаюсь, если совсем застрял».

Важно: не оправдывайтесь слишком долго и не извиняйтесь за отказ. Короткий, дружелюбный и твёрдый ответ воспринимается лучше, чем длинные объяснения."""),
    ]),
    C("u20", "Japanese", [
        ("東京から日帰りで行ける温泉を教えてください。電車で行けるところがいいです。",
         """東京から電車で日帰りできる温泉をいくつかご紹介します。

1. **箱根（神奈川県）**
   新宿からロマンスカーで約85分。日帰り温泉施設が多く、美術館や芦ノ湖観光も一緒に楽しめます。

2. **熱海（静岡県）**
   東京駅から新幹線で約40分。駅前に日帰り入浴できる施設があり、海鮮グルメも充実しています。

3. **鬼怒川温泉（栃木県）**
   浅草から特急で約2時間。渓谷沿いの景色がきれいです。

4. **伊香保温泉（群馬県）**
   上野から特急と路線バスで約2時間半。石段街の雰囲気が有名です。

5. **秩父（埼玉県）**
   池袋から西武特急ラビューで約80分。比較的のんびりできる日帰り温泉があります。

移動時間を短くしたいなら箱根か熱海がおすすめです。"""),
        ("一番空いてるのはどこですか？",
         """この中では **秩父** が比較的空いていることが多いです。箱根や熱海は週末や連休にかなり混雑します。

さらに空いている時間を狙うなら:
- 平日の午前中に行く
- 連休や紅葉シーズン（11月）を避ける
- 大型施設ではなく、地元の共同浴場や小さな日帰り施設を選ぶ

伊香保も平日ならゆったりできますが、移動時間が少し長めです。"""),
    ]),
    C("u21", "English", [
        ("hi", "Hello! How can I help you today?"),
        ("what can you do",
         """Quite a lot! For example, I can:

- **Write and edit**: emails, essays, cover letters, social media posts, stories.
- **Explain things**: science, history, finance, or anything you're curious about.
- **Help with plans**: trips, meal plans, workout routines, study schedules.
- **Work with code**: write, explain or debug programs.
- **Brainstorm**: gift ideas, names, business ideas.
- **Translate** between many languages.

What would you like to try?"""),
    ]),
    C("u22", "English", [
        ("Is it realistic to cycle from Amsterdam to Utrecht and back in one day? I'm reasonably fit but not really a cyclist.",
         """Yes, it's very doable. Amsterdam to Utrecht is roughly 40–45 km each way, so about 85 km in total, and the Netherlands is flat with excellent separated bike paths.

At a relaxed pace of 15–18 km/h, expect around 2.5–3 hours each way plus breaks.

Tips:
- **Route:** follow the Amstel river out of Amsterdam and then the Vecht towards Utrecht. It's scenic, passes villages like Breukelen and Maarssen, and avoids busy roads. The LF7 signposted route covers much of it.
- **Bike:** rent a hybrid or touring bike rather than a heavy city bike with one gear.
- **Wind:** headwind is the real enemy in the Netherlands. Check the forecast and plan to ride into the wind on the way out while you're fresh.
- **Backup:** if you get tired, you can take the train back from Utrecht Centraal with your bike (buy a bike day ticket and avoid rush hours)."""),
    ]),
    C("u24", "English", [
        ("Help me write the opening paragraph of my personal statement for a master's in public health. I worked as an EMT for three years in rural Maine and saw a lot of opioid overdoses.",
         """Here's a draft opening:

"The call came in at 2:14 a.m.: a twenty-three-year-old, unresponsive, forty minutes from the nearest hospital. By the time we arrived, his mother had already given him the naloxone we'd left with her the month before. He survived. Over three years as an EMT in rural Maine, I learned that the most important intervention often happened long before our ambulance pulled up, and that is why I want to study public health."

This opens with a specific moment and then connects it to your motivation."""),
        ("don't start with a quote or a dramatic scene, admissions people hate that apparently",
         """Good call; many admissions readers do see a lot of dramatic openings. Here's a more direct version that still shows your experience:

"For three years I worked as an EMT in rural Maine, where the nearest hospital could be forty minutes away and opioid overdoses were among our most frequent calls. Over time I noticed that the outcomes we could influence in the ambulance were limited; what mattered more was whether families had naloxone at home, whether patients were connected to treatment after discharge, and whether anyone followed up at all. I am applying to the MPH program to learn how to design and evaluate the kind of community-level interventions that reach people before the emergency call."

It leads with your role and a concrete insight, then states your goal clearly."""),
    ], system=SYS_DEFAULT),
    C("u02", "English", [
        ("give me a short funny toast for my brother's wedding, he's a software engineer and his wife is a vet",
         """Here's a short one:

"For those who don't know me, I'm Mark's brother. Mark is a software engineer, which means he's spent years fixing bugs. Sarah is a vet, which means she's spent years taking care of animals who can't explain what's wrong with them.

So honestly, Sarah, you were perfectly trained for living with my brother.

Mark, you finally found the one person whose code you'll never need to debug. Sarah, thank you for giving him a lifetime warranty.

To Mark and Sarah!"

Swap in their real names, and if you know an inside joke, it'll get a bigger laugh than anything generic."""),
    ]),
    C("u08", "Portuguese", [
        ("Me ajuda a escrever uma legenda pro Instagram sobre minha formatura em enfermagem?",
         """Claro! Algumas opções:

1. "Cinco anos, muitos plantões e um sonho realizado: oficialmente enfermeira! 🩺💙"
2. "Cuidar sempre foi minha vocação. Hoje, também é minha profissão."
3. "Obrigada a todos que seguraram minha mão para que eu pudesse aprender a segurar a dos outros."
4. "Jaleco branco, coração cheio. Formada!"

Quer algo mais emocionante ou mais divertido?"""),
        (("actually can you do it in english? half my friends are from my exchange in Dublin", "English"),
         ("""Of course! Here are some English options:

1. "Five years, countless night shifts, one dream come true: officially a nurse! 🩺💙"
2. "Caring was always my calling. Now it's also my job."
3. "Thank you to everyone who held my hand so I could learn to hold others'."
4. "White coat, full heart. Graduated!"

You could also post it bilingual, with the Portuguese line first and the English one underneath.""", "English")),
    ]),
    C("u25", "English", [
        ("3 day bali itinerary with 2 kids (5 and 8). staying in sanur. we don't want to spend hours in the car",
         """Sanur is a great base with kids: calm beach, flat promenade, and short drives to a lot of things. Here's a low-driving plan:

**Day 1: Sanur itself**
- Morning on the beach (the water is calm thanks to the reef).
- Rent bikes or a bike trailer and ride the beachfront path.
- Afternoon pool time and an early dinner at a warung on the beach.

**Day 2: Animals and water (20–40 min drives)**
- Bali Bird Park or the Bali Safari in the morning, before it gets hot.
- Afternoon at a waterpark (Waterbom in Kuta is about 30–40 minutes away, depending on traffic).

**Day 3: Culture, kid-sized**
- Short drive to Ubud (about 45–60 minutes; the longest trip of the three days).
- Ubud Monkey Forest, Tegallalang rice terraces for a short walk, lunch with a view.
- Head back mid-afternoon before traffic builds.

Tips: leave early (traffic gets bad after 10am), bring snacks and water everywhere, and hire a driver for the day rather than taxis. It's affordable and the kids can nap in the car."""),
        ("is the monkey forest safe for kids?",
         """Generally yes, with some precautions. The monkeys are used to people but they are wild and can grab things:

- **Remove everything loose**: sunglasses, hats, hair clips, water bottles, snacks. Monkeys can smell food in bags.
- **Don't let the kids feed or touch them**, and tell them not to stare or show teeth (smiling widely can look like a threat).
- **Keep the 5-year-old close or carry them** in the busier areas.
- **If a monkey jumps on someone**, stay calm, don't pull away, and let the staff help.

Plenty of families visit without any problems. If your kids are nervous around animals, a shorter visit (30–45 minutes) along the main path is a good compromise."""),
    ]),
    C("u23", "English", [
        ("Can you correct my sentence? 'Yesterday I go to the market with my mother and buyed many fruits.'",
         """Corrected: "Yesterday I **went** to the market with my mother and **bought a lot of fruit**."

- "go" → "went": past tense, because it happened yesterday.
- "buyed" → "bought": "buy" is an irregular verb.
- "many fruits" → "a lot of fruit": "fruit" is usually uncountable in everyday English."""),
        ("'She don't like coffee but she like tea.'", "Corrected: \"She **doesn't** like coffee, but she **likes** tea.\""),
        ("why doesn't and not don't?",
         """Because the subject is "she". In the present simple, he/she/it takes a special form:

- I/you/we/they **don't** like coffee.
- He/she/it **doesn't** like coffee.

It's the same rule as "she like**s**": with he/she/it, the verb or the helper verb (do → does) changes."""),
        ("'I am living in Hanoi since 2015.'",
         """Corrected: "I **have been living** in Hanoi since 2015." (or "I **have lived** in Hanoi since 2015.")

When an action started in the past and continues now, and you use "since" or "for", English uses the present perfect, not the present continuous."""),
        ("ok. 'If I will have time, I will call you.'",
         """Corrected: "If I **have** time, I will call you." (or "I'll call you.")

After "if" (in the first conditional), we use the present simple, not "will", even when we're talking about the future."""),
        ("thank you teacher 🙏", "You're very welcome! Your English is improving. Feel free to send more sentences any time. 😊"),
    ]),
]

CODING = [
    C("u02", "English", [
        ("""why does this print None

```python
nums = [3, 1, 2]
sorted_nums = nums.sort()
print(sorted_nums)
```""",
         """`list.sort()` sorts the list **in place** and returns `None`. So `sorted_nums` is `None`, while `nums` itself is now sorted.

You have two options:

```python
# 1. sort in place, then use the same list
nums = [3, 1, 2]
nums.sort()
print(nums)          # [1, 2, 3]

# 2. get a new sorted list and keep the original
nums = [3, 1, 2]
sorted_nums = sorted(nums)
print(sorted_nums)   # [1, 2, 3]
print(nums)          # [3, 1, 2]
```

Many in-place methods in Python return `None` on purpose (`append`, `extend`, `reverse`, `sort`), so you don't accidentally assume you got a copy."""),
        ("ok and whats the difference in speed",
         """Practically none for the sort itself: both use the same algorithm (Timsort, O(n log n)).

The only difference is that `sorted()` first makes a copy of the list, which costs O(n) time and extra memory. For a few thousand items you won't notice; for tens of millions of items, sorting in place with `.sort()` saves memory."""),
    ]),
    C("u02", "English", [
        ("write me a full flask app with user registration and login, sqlite, password hashing. no explanations just code",
         """```python
# app.py
import sqlite3
from flask import Flask, render_template_string, request, redirect, url_for, flash, g
from flask_login import LoginManager, UserMixin, login_user, logout_user, login_required, current_user
from werkzeug.security import generate_password_hash, check_password_hash

app = Flask(__name__)
app.config["SECRET_KEY"] = "change-me"
DB = "users.db"

login_manager = LoginManager(app)
login_manager.login_view = "login"


def get_db():
    if "db" not in g:
        g.db = sqlite3.connect(DB)
        g.db.row_factory = sqlite3.Row
    return g.db


@app.teardown_appcontext
def close_db(exc):
    db = g.pop("db", None)
    if db is not None:
        db.close()


def init_db():
    with app.app_context():
        get_db().execute(
            "CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, username TEXT UNIQUE NOT NULL, password TEXT NOT NULL)"
        )
        get_db().commit()


class User(UserMixin):
    def __init__(self, row):
        self.id, self.username = row["id"], row["username"]


@login_manager.user_loader
def load_user(user_id):
    row = get_db().execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
    return User(row) if row else None


FORM = '''
<h2>{{ title }}</h2>
{% with msgs = get_flashed_messages() %}{% for m in msgs %}<p>{{ m }}</p>{% endfor %}{% endwith %}
<form method="post">
  <input name="username" placeholder="username" required>
  <input name="password" type="password" placeholder="password" required>
  <button>{{ title }}</button>
</form>
'''


@app.route("/register", methods=["GET", "POST"])
def register():
    if request.method == "POST":
        try:
            get_db().execute(
                "INSERT INTO users (username, password) VALUES (?, ?)",
                (request.form["username"], generate_password_hash(request.form["password"])),
            )
            get_db().commit()
            return redirect(url_for("login"))
        except sqlite3.IntegrityError:
            flash("Username already taken")
    return render_template_string(FORM, title="Register")


@app.route("/login", methods=["GET", "POST"])
def login():
    if request.method == "POST":
        row = get_db().execute("SELECT * FROM users WHERE username = ?", (request.form["username"],)).fetchone()
        if row and check_password_hash(row["password"], request.form["password"]):
            login_user(User(row))
            return redirect(url_for("index"))
        flash("Invalid credentials")
    return render_template_string(FORM, title="Login")


@app.route("/logout")
@login_required
def logout():
    logout_user()
    return redirect(url_for("login"))


@app.route("/")
@login_required
def index():
    return f"Hello, {current_user.username}! <a href='/logout'>Log out</a>"


if __name__ == "__main__":
    init_db()
    app.run(debug=True)
```"""),
        ("it doesnt work. fix it",
         """I can help, but I need a bit more to go on. What happens when you run it?

- Paste the full error message / traceback from the terminal, or
- describe what you see in the browser (blank page, 500 error, redirect loop, ...).

Also, which versions do you have installed? Run `pip show flask flask-login werkzeug` and paste the output."""),
        ("ImportError: cannot import name 'url_decode' from 'werkzeug.urls'",
         """That's a version mismatch, not a bug in the app code. Werkzeug 3.0 removed `url_decode`, and older versions of Flask-Login still import it.

Fix it by upgrading Flask-Login:

```bash
pip install -U "flask-login>=0.6.3"
```

Or, if you can't upgrade it, pin Werkzeug below 3:

```bash
pip install "werkzeug<3"
```

Then run `python app.py` again. To avoid this in future, put the versions in a `requirements.txt`:

```
flask>=3.0
flask-login>=0.6.3
werkzeug>=3.0
```"""),
    ]),
    C("u02", "English", [
        ("postgres: I have orders(id, customer_id, region, amount, created_at). Need top 3 customers by total spend per region for 2023",
         """Use a CTE to aggregate, then a window function to rank inside each region:

```sql
WITH spend AS (
    SELECT region,
           customer_id,
           SUM(amount) AS total_spend
    FROM orders
    WHERE created_at >= DATE '2023-01-01'
      AND created_at <  DATE '2024-01-01'
    GROUP BY region, customer_id
),
ranked AS (
    SELECT *,
           ROW_NUMBER() OVER (PARTITION BY region ORDER BY total_spend DESC) AS rn
    FROM spend
)
SELECT region, customer_id, total_spend
FROM ranked
WHERE rn <= 3
ORDER BY region, total_spend DESC;
```

Using a half-open date range (`>= 2023-01-01 AND < 2024-01-01`) instead of `EXTRACT(YEAR ...)` lets Postgres use an index on `created_at`."""),
        ("what if two customers tie",
         """`ROW_NUMBER()` breaks ties arbitrarily, so you'd always get exactly 3 rows per region and one of the tied customers could be dropped. Alternatives:

- `RANK()`: tied customers share a rank and the next rank is skipped (1, 2, 2, 4). With `rn <= 3` you might get 4 rows.
- `DENSE_RANK()`: tied customers share a rank without gaps (1, 2, 2, 3). You could get even more rows.

If you want exactly 3 rows but deterministic, keep `ROW_NUMBER()` and add a tiebreaker:

```sql
ROW_NUMBER() OVER (PARTITION BY region ORDER BY total_spend DESC, customer_id) AS rn
```"""),
    ]),
    C("u09", "English", [
        ("""Getting TypeError: Cannot read properties of undefined (reading 'map') in my React component. the data comes from an API

```jsx
function Products() {
  const [data, setData] = useState();
  useEffect(() => {
    fetch('/api/products').then(r => r.json()).then(setData);
  }, []);
  return <ul>{data.products.map(p => <li key={p.id}>{p.name}</li>)}</ul>;
}
```""",
         """On the first render, `data` is `undefined` because the fetch hasn't finished yet, so `data.products` throws.

Handle the loading state:

```jsx
function Products() {
  const [data, setData] = useState(null);

  useEffect(() => {
    fetch('/api/products')
      .then(r => r.json())
      .then(setData)
      .catch(console.error);
  }, []);

  if (!data) return <p>Loading...</p>;

  return (
    <ul>
      {data.products.map(p => <li key={p.id}>{p.name}</li>)}
    </ul>
  );
}
```

Or, more compact: `{data?.products?.map(...)}`."""),
        ("still error. the api returns an array directly not {products: []}",
         """Then `data.products` will always be `undefined`, since the response itself is the array. Use it directly, and start with an empty array so `.map` is always safe:

```jsx
const [products, setProducts] = useState([]);

useEffect(() => {
  fetch('/api/products')
    .then(r => r.json())
    .then(setProducts);
}, []);

return <ul>{products.map(p => <li key={p.id}>{p.name}</li>)}</ul>;
```"""),
        ("works, thanks bro", "Glad it works! 👍"),
    ]),
    C("u09", "English", [
        ("difference between HashMap and ConcurrentHashMap in java? interview tomorrow",
         """Key differences:

- **Thread safety:** `HashMap` is not thread-safe. `ConcurrentHashMap` is designed for concurrent access.
- **Locking:** Since Java 8, `ConcurrentHashMap` uses CAS operations and synchronizes only on individual bins when writing, so reads are mostly lock-free and different threads can update different buckets at the same time. (Java 7 used segment locks.)
- **Nulls:** `HashMap` allows one null key and null values. `ConcurrentHashMap` allows **no** null keys or values (a null would be ambiguous with "absent" in concurrent code).
- **Iterators:** `HashMap` iterators are fail-fast (throw `ConcurrentModificationException`). `ConcurrentHashMap` iterators are weakly consistent and never throw that exception.
- **Atomic operations:** `ConcurrentHashMap` offers `putIfAbsent`, `computeIfAbsent`, `merge` that are atomic.
- **Performance:** `HashMap` is slightly faster in single-threaded code.

A good interview line: "Use `HashMap` for single-threaded or confined data, and `ConcurrentHashMap` instead of `Collections.synchronizedMap` when multiple threads read and write."

Good luck tomorrow!"""),
    ]),
    C("u12", "English", [
        ("regex for email validation. just the regex, no essay",
         "```\n^[A-Za-z0-9._%-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$\n```"),
        ("that rejects plus addresses like me+news@gmail.com. useless",
         "```\n^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$\n```\nAdded `+` to the local part."),
    ]),
    C("u14", "English", [
        ("I have like 300 files named IMG_0001.JPG etc. want to rename them to trip-2023-0001.jpg (lowercase ext). mac terminal",
         """Run this in the folder with the photos:

```bash
for f in IMG_*.*; do
  num="${f#IMG_}"; num="${num%.*}"
  ext="${f##*.}"
  mv -n -- "$f" "trip-2023-${num}.${ext,,}"
done
```

- `${f#IMG_}` strips the prefix, `${num%.*}` strips the extension.
- `${ext,,}` lowercases the extension.
- `mv -n` won't overwrite existing files.

Try it on a copy of a few files first."""),
        ("says 'bad substitution'",
         """That's my fault: `${ext,,}` needs bash 4+, and macOS ships bash 3.2 (and zsh as the default shell). Here's a version that works in both:

```bash
for f in IMG_*.*; do
  num="${f#IMG_}"; num="${num%.*}"
  ext=$(printf '%s' "${f##*.}" | tr '[:upper:]' '[:lower:]')
  mv -n -- "$f" "trip-2023-${num}.${ext}"
done
```

To preview without renaming, replace `mv -n --` with `echo mv -n --` first."""),
    ]),
    C("u06", "Chinese", [
        ("Python 中如何读取一个很大的 CSV 文件（大概 20GB）而不爆内存？我只需要统计每个城市的订单数量。",
         """20GB 的文件不要一次性 `pd.read_csv`，可以分块读取，边读边统计：

```python
import pandas as pd
from collections import Counter

counts = Counter()
for chunk in pd.read_csv(
    "orders.csv",
    usecols=["city"],        # 只读需要的列
    dtype={"city": "category"},
    chunksize=1_000_000,     # 每次读 100 万行
):
    counts.update(chunk["city"].value_counts().to_dict())

result = pd.Series(counts).sort_values(ascending=False)
print(result.head(20))
```

要点：
1. **`usecols`** 只读 `city` 这一列，内存占用会小很多。
2. **`chunksize`** 分块读取，每块处理完就释放。
3. 如果只是计数，也可以用标准库 `csv` 模块逐行读取，内存几乎不增长，只是速度慢一些。

另外，DuckDB 或 Polars 处理这种规模的数据会更快，例如：

```python
import duckdb
duckdb.sql("SELECT city, COUNT(*) AS n FROM 'orders.csv' GROUP BY city ORDER BY n DESC").show()
```"""),
        ("用 chunksize 的话大概要多久？",
         """取决于磁盘速度、CPU 和列的数量，粗略估计：

- pandas 分块只读一列：大约每秒 50–150 MB，20GB 大概需要 **3–7 分钟**。
- 如果读取所有列，可能会慢好几倍。
- DuckDB 通常是多线程的，同样的查询往往 **1–2 分钟** 就能完成。

建议先用 `nrows=5_000_000` 测一下耗时，再按比例估算总时间。"""),
    ]),
    C("u07", "Korean", [
        ("자바스크립트 async/await 쉽게 설명해줘. 예제도 같이",
         """`async/await`는 **비동기 코드를 동기 코드처럼 읽기 쉽게 쓰는 문법**이에요.

예를 들어, 서버에서 데이터를 가져오는 작업은 시간이 걸리죠. 예전에는 `.then()`을 계속 이어 붙였어요:

```javascript
fetch('/api/user')
  .then(res => res.json())
  .then(user => console.log(user.name))
  .catch(err => console.error(err));
```

`async/await`를 쓰면 이렇게 바뀌어요:

```javascript
async function showUser() {
  try {
    const res = await fetch('/api/user');   // 응답이 올 때까지 기다림
    const user = await res.json();          // JSON 변환이 끝날 때까지 기다림
    console.log(user.name);
  } catch (err) {
    console.error(err);                     // 에러 처리
  }
}

showUser();
```

핵심 정리:
- `async`를 붙인 함수는 항상 **Promise를 반환**해요.
- `await`는 `async` 함수 안에서만 쓸 수 있고, Promise가 끝날 때까지 **그 함수 안에서만** 기다려요. 다른 코드는 멈추지 않아요.
- 에러는 `try/catch`로 처리해요.

여러 요청을 동시에 보내고 싶다면 `Promise.all`을 같이 쓰면 돼요:

```javascript
const [user, posts] = await Promise.all([getUser(), getPosts()]);
```"""),
    ]),
    C("u04", "German", [
        ("""Warum bekomme ich 'IndentationError: unexpected indent'? Der Code sieht richtig aus

```python
def summe(liste):
    ergebnis = 0
    for x in liste:
        ergebnis += x
      return ergebnis
```""",
         """Das Problem ist die Zeile `return ergebnis`: Sie ist mit 6 Leerzeichen eingerückt, während die anderen Ebenen 4 bzw. 8 Leerzeichen haben. Python erwartet, dass jede Einrückung genau zu einer vorherigen Ebene passt.

Da `return` nach der Schleife kommen soll, muss es auf der gleichen Ebene wie `for` stehen:

```python
def summe(liste):
    ergebnis = 0
    for x in liste:
        ergebnis += x
    return ergebnis
```

(Wenn du es auf 8 Leerzeichen einrückst, würde die Funktion schon nach dem ersten Element zurückkehren.)"""),
        ("Ah ok. Und wie kann ich verhindern, dass mir das nochmal passiert?",
         """Ein paar Tipps:

1. **Editor richtig einstellen:** Tab-Taste fügt 4 Leerzeichen ein (in VS Code ist das für Python Standard). Tabs und Leerzeichen nie mischen.
2. **Leerzeichen sichtbar machen:** In VS Code `"editor.renderWhitespace": "all"`.
3. **Automatisch formatieren:** Mit `black` oder `ruff format` wird der Code beim Speichern einheitlich eingerückt.
4. **Linter benutzen:** `ruff` oder `flake8` zeigen solche Fehler schon beim Tippen an."""),
    ]),
    C("u18", "English", [
        ("""this prints 81 on my machine but segfaults on the school server, why

```cpp
#include <iostream>
#include <vector>

int main() {
    std::vector<int> v;
    v.reserve(10);
    for (int i = 0; i < 10; ++i) v[i] = i * i;
    std::cout << v[9] << std::endl;
}
```""",
         """`reserve(10)` only allocates capacity; it does **not** change the vector's size. After `reserve`, `v.size()` is still 0, so `v[i]` writes to elements that don't exist. That's undefined behaviour.

Fix it with either of these:

```cpp
std::vector<int> v(10);          // size 10, all zeros
for (int i = 0; i < 10; ++i) v[i] = i * i;
```

or

```cpp
std::vector<int> v;
v.reserve(10);                   // optional, avoids reallocations
for (int i = 0; i < 10; ++i) v.push_back(i * i);
```"""),
        ("but why does it work on mine",
         """Because undefined behaviour doesn't mean "guaranteed crash". It means anything can happen, including appearing to work.

On your machine, `reserve` allocated memory for 10 ints, so the writes land in memory your program owns. Nothing checks the size, and reading `v[9]` returns whatever you wrote there. On the school server, a different compiler, standard library, optimisation level or debug checks can change what happens. For example, if the library is built with bounds checking or the compiler optimises assuming size 0, it can crash.

The code was broken in both places; only one of them told you."""),
        ("how do i catch this stuff earlier",
         """A few tools that would have flagged this immediately:

- **AddressSanitizer:** compile with `-fsanitize=address -g`. It reports out-of-bounds accesses with a stack trace.
- **libstdc++ debug mode:** `-D_GLIBCXX_DEBUG` makes `operator[]` check bounds (GCC).
- **Use `.at(i)` while learning:** it throws `std::out_of_range` instead of silently misbehaving.
- **Warnings:** always compile with `-Wall -Wextra`.
- **Valgrind** on Linux: `valgrind ./a.out` catches invalid reads and writes.

A good default for homework: `g++ -std=c++17 -Wall -Wextra -g -fsanitize=address,undefined main.cpp`."""),
    ]),
    C("u18", "English", [
        ("git undo last commit but keep my changes",
         """```bash
git reset --soft HEAD~1
```

This removes the last commit but keeps all its changes staged. If you want them unstaged instead, use `git reset HEAD~1` (the default `--mixed`).

If you already pushed that commit to a shared branch, don't rewrite history; use `git revert HEAD` to create a new commit that undoes it."""),
    ]),
    C("u23", "English", [
        ("""my flask app in docker can't connect to postgres. error: connection to server at "localhost" (127.0.0.1), port 5432 failed: Connection refused

docker-compose.yml:
```yaml
services:
  web:
    build: .
    ports: ["5000:5000"]
    environment:
      DATABASE_URL: postgresql://postgres:secret@localhost:5432/app
  db:
    image: postgres:15
    environment:
      POSTGRES_PASSWORD: secret
      POSTGRES_DB: app
    volumes:
      - pgdata:/var/lib/postgresql/data
volumes:
  pgdata:
```""",
         """Inside the `web` container, `localhost` means the web container itself, not the database. In Docker Compose, services reach each other by **service name**, so the host should be `db`:

```yaml
    environment:
      DATABASE_URL: postgresql://postgres:secret@db:5432/app
```

It's also a good idea to wait until Postgres is ready:

```yaml
  web:
    depends_on:
      db:
        condition: service_healthy
  db:
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U postgres"]
      interval: 5s
      retries: 10
```"""),
        ("now it says password authentication failed for user \"postgres\"",
         """That usually means the database volume was created earlier with a different password. The `POSTGRES_PASSWORD` variable is only used the **first time** the data directory is initialised; after that, changing it in the compose file has no effect.

The quickest fix is to recreate the volume:

```bash
docker compose down -v
docker compose up --build
```"""),
        ("that deleted my data??",
         """Yes. `down -v` removes the named volumes, including `pgdata`, so the database was reset. I'm sorry, I should have warned you about that before suggesting it.

If you don't have a backup, the data in that volume can't be recovered through Docker. If it was only test data, you can recreate it; if it mattered, check whether you have any `pg_dump` files or seed scripts.

For the future, the non-destructive fix is to change the password inside the existing database instead:

```bash
docker compose exec db psql -U postgres -c "ALTER USER postgres PASSWORD 'secret';"
```

And to back up before risky changes:

```bash
docker compose exec db pg_dump -U postgres app > backup.sql
```"""),
    ]),
    C("u24", "English", [
        ("I have a dataframe with columns store, date, sales. I want average daily sales per store but only counting days where sales > 0",
         """Filter first, then group:

```python
avg_sales = (
    df[df["sales"] > 0]
    .groupby("store")["sales"]
    .mean()
)
```"""),
        ("you are wrong. groupby mean already ignores zeros",
         """It doesn't, actually. `mean()` ignores `NaN` values, but zeros are included in the average. Quick check:

```python
import pandas as pd

df = pd.DataFrame({"store": ["A", "A", "A"], "sales": [10, 0, 20]})
print(df.groupby("store")["sales"].mean())   # 10.0  (zeros included)
print(df[df.sales > 0].groupby("store")["sales"].mean())   # 15.0
```

If your zero days are stored as `NaN` rather than `0`, then yes, `mean()` would skip them automatically."""),
        ("ok whatever. now also give me the number of zero days per store in the same table",
         """Use named aggregation so both columns come out in one table:

```python
summary = df.groupby("store").agg(
    avg_sales_nonzero=("sales", lambda s: s[s > 0].mean()),
    zero_days=("sales", lambda s: (s == 0).sum()),
)
```"""),
        ("actually I need it per month too. and sorted by the zero days descending",
         """Add a month column to the grouping and sort at the end:

```python
df["date"] = pd.to_datetime(df["date"])
df["month"] = df["date"].dt.to_period("M")

summary = (
    df.groupby(["store", "month"])
      .agg(
          avg_sales_nonzero=("sales", lambda s: s[s > 0].mean()),
          zero_days=("sales", lambda s: (s == 0).sum()),
      )
      .reset_index()
      .sort_values("zero_days", ascending=False)
)
```

A store-month with no sales at all will show `NaN` for the average."""),
    ]),
    C("u11", "English", [
        ("In Excel what's the difference between VLOOKUP and XLOOKUP and which should I use? My work computer has Office 2016 if that matters",
         """It matters a lot: **XLOOKUP isn't available in Excel 2016.** It only exists in Microsoft 365 and Excel 2021 or later.

Differences, for reference:
- **VLOOKUP** searches the first column of a range and returns a value from a column number to the right. It can't look left, and it breaks if you insert columns.
- **XLOOKUP** lets you pick separate lookup and return ranges, can look left, defaults to exact match, and has a built-in "if not found" argument.

On Office 2016, the best alternative to XLOOKUP is **INDEX/MATCH**, which has most of the same advantages (looks left, doesn't break when columns move)."""),
        ("show me index match for looking up a price by product code in sheet2",
         """Assuming Sheet2 has product codes in column A and prices in column B, and your code is in A2 on the current sheet:

```
=INDEX(Sheet2!$B:$B, MATCH(A2, Sheet2!$A:$A, 0))
```

- `MATCH(A2, Sheet2!$A:$A, 0)` finds the row of the code (0 = exact match).
- `INDEX(Sheet2!$B:$B, ...)` returns the price from that row.

To show something nicer than `#N/A` when a code is missing:

```
=IFERROR(INDEX(Sheet2!$B:$B, MATCH(A2, Sheet2!$A:$A, 0)), "Not found")
```"""),
    ]),
    C("u16", "English", [
        ("my RecyclerView shows nothing, adapter getItemCount returns correct size. kotlin",
         """The most common cause is a missing LayoutManager. Without one, RecyclerView won't lay out any items:

```kotlin
recyclerView.layoutManager = LinearLayoutManager(this)
recyclerView.adapter = MyAdapter(items)
```

Other things to check:
- `onCreateViewHolder` inflates with `LayoutInflater.from(parent.context).inflate(R.layout.item, parent, false)`.
- `onBindViewHolder` actually sets the text or images.
- If you update the list later, call `notifyDataSetChanged()` (or use `ListAdapter` with `submitList`)."""),
        ("i added LinearLayoutManager still blank",
         """Then let's check the layouts. Two frequent culprits:

1. **The RecyclerView has zero height.** For example inside a `ConstraintLayout` with `android:layout_height="0dp"` but missing top/bottom constraints. Try temporarily setting `android:layout_height="match_parent"` to see if items appear.

2. **The item layout is taking the whole screen or is invisible.** If your item's root view has `layout_height="match_parent"`, each item fills the screen; set it to `wrap_content`. Also check the text color isn't the same as the background.

If neither helps, paste your adapter and the XML for the activity and the item, and I'll take a look."""),
    ]),
    C("u21", "English", [
        ("fix my code", "Sure! Please paste the code and tell me what it's supposed to do and what's going wrong (an error message or the output you get)."),
        ("""```js
for (var i = 0; i < 3; i++) {
  setTimeout(function () { console.log(i); }, 100);
}
```
it prints 3 3 3 instead of 0 1 2""",
         """This is a classic closure issue. `var` is function-scoped, so all three callbacks share the **same** `i`. By the time the timeouts run, the loop has finished and `i` is 3.

Use `let`, which creates a new binding for each iteration:

```js
for (let i = 0; i < 3; i++) {
  setTimeout(function () { console.log(i); }, 100);
}
// 0 1 2
```"""),
        ("ty", "You're welcome!"),
    ]),
    C("u25", "English", [
        ("""getting error[E0502]: cannot borrow `v` as mutable because it is also borrowed as immutable

```rust
fn main() {
    let mut v = vec![1, 2, 3];
    let first = &v[0];
    v.push(4);
    println!("{}", first);
}
```""",
         """`first` is an immutable reference into `v`, and it's still used later in `println!`. While that reference is alive, Rust won't let you mutate `v` with `push`.

Options:

```rust
// 1. copy the value instead of borrowing it (i32 is Copy)
let first = v[0];
v.push(4);
println!("{}", first);
```

```rust
// 2. finish using the reference before mutating
let first = &v[0];
println!("{}", first);
v.push(4);
```"""),
        ("why does rust care, it's just an int",
         """Because `first` isn't the int; it's a **pointer** to the int inside the vector's heap buffer.

When you `push`, the vector may run out of capacity and reallocate: it allocates a bigger buffer, moves the elements there, and frees the old one. Your reference would then point to freed memory, a dangling pointer. In C++ this compiles and is a bug; Rust refuses at compile time.

If you copy the value (`let first = v[0];`), there's no pointer into the vector anymore, so the problem disappears."""),
    ]),
    C("u10", "English", [
        ("python: parse lines like `2023-08-14 10:22:01,532 ERROR [payments] Timeout after 30s (order=8812)` into a dict with timestamp, level, module, message, order id (order id may be missing)",
         r"""Here's a regex with named groups:

```python
import re

LINE_RE = re.compile(
    r"^(?P<timestamp>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\s+"
    r"(?P<level>[A-Z]+)\s+"
    r"\[(?P<module>[^\]]+)\]\s+"
    r"(?P<message>.*?)"
    r"(?:\s*\(order=(?P<order_id>\d+)\))?$"
)


def parse_line(line: str) -> dict | None:
    m = LINE_RE.match(line.strip())
    if not m:
        return None
    d = m.groupdict()
    d["order_id"] = int(d["order_id"]) if d["order_id"] else None
    return d


print(parse_line("2023-08-14 10:22:01,532 ERROR [payments] Timeout after 30s (order=8812)"))
# {'timestamp': '2023-08-14 10:22:01,532', 'level': 'ERROR', 'module': 'payments',
#  'message': 'Timeout after 30s', 'order_id': 8812}
print(parse_line("2023-08-14 10:22:05,001 INFO [auth] User logged in"))
# {..., 'message': 'User logged in', 'order_id': None}
```

The message group is non-greedy (`.*?`) so the optional `(order=...)` part at the end is captured separately when present."""),
    ]),
    C("u08", "Portuguese", [
        ("como faço um loop em python que pula os números pares de 1 a 20?",
         """Tem várias formas. A mais simples é usar `continue`:

```python
for n in range(1, 21):
    if n % 2 == 0:
        continue   # pula os pares
    print(n)
```

Ou, sem `if`, usando o passo do `range`:

```python
for n in range(1, 21, 2):
    print(n)
```

As duas imprimem 1, 3, 5, ..., 19."""),
    ]),
    C("u13", "English", [
        ("explain two sum solution with hashmap. why is it O(n)",
         """The idea: as you scan the array, remember every number you've seen and its index in a hash map. For each new number `x`, the partner you need is `target - x`. If it's already in the map, you're done.

```python
def two_sum(nums, target):
    seen = {}                      # value -> index
    for i, x in enumerate(nums):
        if target - x in seen:
            return [seen[target - x], i]
        seen[x] = i
    return None
```

**Why O(n):** you visit each element once, and each step does a hash map lookup and insert, which are O(1) on average. So the total is n × O(1) = O(n) time, with O(n) extra space for the map. The brute-force version checks every pair, which is O(n²)."""),
        ("now do it in O(n) time and O(1) space",
         """For the general problem (unsorted array, return the original indices), that isn't possible with known techniques: you either need extra memory (hash map, O(n) space) or you need to sort, which costs O(n log n) time.

What you can do:

- **If the array is already sorted**, use two pointers: O(n) time, O(1) space.

```python
def two_sum_sorted(nums, target):
    lo, hi = 0, len(nums) - 1
    while lo < hi:
        s = nums[lo] + nums[hi]
        if s == target:
            return [lo, hi]
        if s < target:
            lo += 1
        else:
            hi -= 1
    return None
```

- **If it's unsorted**, sorting in place then using two pointers gives O(n log n) time and O(1) extra space (ignoring the sort's stack), but you lose the original indices.

In an interview, explaining this trade-off is usually exactly what they want to hear."""),
    ]),
    C("u22", "English", [
        ("how do I type a function that takes an object and a key and returns the value for that key in TypeScript",
         """```ts
function getProp<T, K extends keyof T>(obj: T, key: K): T[K] {
  return obj[key];
}

const user = { id: 1, name: "Sanne" };
const n = getProp(user, "name"); // string
getProp(user, "email");          // compile error
```

`K extends keyof T` restricts the key to real property names, and `T[K]` is the exact type of that property."""),
        ("and if the key might not exist?",
         """Then accept any string and return `unknown` (or a union with `undefined`) for keys that aren't known:

```ts
function getProp<T extends object>(obj: T, key: PropertyKey): unknown {
  return (obj as Record<PropertyKey, unknown>)[key];
}
```

If you want to keep the precise type when the key *is* known, use overloads:

```ts
function getProp<T, K extends keyof T>(obj: T, key: K): T[K];
function getProp<T>(obj: T, key: string): unknown;
function getProp(obj: any, key: string) {
  return obj[key];
}
```"""),
    ], system="You are a senior software engineer. Answer concisely."),
    C("u15", "Spanish", [
        ("¿Cómo conecto Node.js con MongoDB? Es para un proyecto de clase, algo sencillo",
         """Para algo sencillo, lo más cómodo es usar **Mongoose**:

1. Instala las dependencias:

```bash
npm install mongoose
```

2. Conéctate y define un modelo:

```javascript
const mongoose = require('mongoose');

async function main() {
  await mongoose.connect('mongodb://127.0.0.1:27017/clase');
  console.log('Conectado a MongoDB');

  const Alumno = mongoose.model('Alumno', new mongoose.Schema({
    nombre: String,
    nota: Number,
  }));

  await Alumno.create({ nombre: 'Lucía', nota: 9 });
  const alumnos = await Alumno.find();
  console.log(alumnos);

  await mongoose.disconnect();
}

main().catch(err => console.error(err));
```

Si usas MongoDB Atlas (en la nube), cambia la URL por la cadena de conexión que te da Atlas y guárdala en una variable de entorno en lugar de ponerla en el código."""),
    ]),
    C("u12", "English", [
        ("center a div horizontally and vertically. one line pls",
         """Use flexbox on the parent:

```css
.parent {
  display: flex;
  justify-content: center;
  align-items: center;
}
```"""),
        ("that's 3 lines. ONE line. on the parent.",
         "```css\n.parent { display: grid; place-items: center; }\n```\nThe parent needs a height (e.g. `min-height: 100vh`) for vertical centering to be visible."),
    ]),
    C("u01", "English", [
        ("I'm a designer, not a developer. What's the easiest way to put my portfolio online without learning to code? I want my own domain",
         """You have several good no-code options, all of which support custom domains:

- **Framer:** very popular with designers; feels like Figma, great animations. Free plan, paid plans for a custom domain.
- **Webflow:** the most powerful and flexible, but a steeper learning curve.
- **Squarespace:** polished templates, easiest overall, less unique.
- **Cargo:** favoured by artists and visual designers, very minimal and editorial.
- **Notion + Super:** quick if your case studies already live in Notion.

A domain usually costs $10–20 a year from a registrar like Namecheap or Cloudflare, and each builder has a guide for connecting it."""),
        ("which one looks least like a template",
         """Framer or Webflow. Both let you start from a blank canvas and control layout, type and spacing freely, so the result looks like you designed it rather than picked it.

Since you already know Figma, **Framer** will probably feel most natural; there's even a plugin to bring Figma frames across. Webflow gives you more control over responsive behaviour and CMS collections, at the cost of learning some web layout concepts."""),
    ]),
]

TOM = [
    C("u09", "English", [
        ("Maya puts her chocolate bar in the blue drawer in the kitchen and goes out to play. While she's gone, her brother Arjun eats half of it and puts the rest in the red box on the shelf. When Maya comes back, where will she look for her chocolate first, and why?",
         """She'll look in the **blue drawer** first.

Maya didn't see Arjun move the chocolate, so her belief hasn't been updated: as far as she knows, it's still exactly where she left it. People act on what they believe, not on what is actually true, so she'll go to the drawer.

This is a classic false-belief situation: we know the chocolate is in the red box, but to predict Maya's behaviour we have to set our own knowledge aside and reason from hers."""),
        ("And what does Arjun think Maya will do when she opens the drawer?",
         """Arjun knows two things Maya doesn't: that the chocolate was moved, and that half of it is gone. But he also knows Maya *didn't* see any of this. So, if he's reasoning about her mind, he'll expect her to:

1. Look in the blue drawer, because that's where she believes it is.
2. Find it empty and be surprised or confused.
3. Quite possibly suspect him, since he was the one at home.

That's second-order reasoning: Arjun is thinking about what Maya believes. Depending on his age and personality, he might be nervous, prepare an excuse, or even hope she'll look in the red box "by accident" so he doesn't get caught."""),
    ]),
    C("u14", "English", [
        ("Here's a puzzle. Omar and Priya both see the bakery sign saying it closes at 6. Omar leaves. Then the baker tells Priya that today it's closing at 4 instead. On his way home Omar also runs into the baker, who tells him the same thing, but Priya doesn't know that Omar talked to the baker. Where does Priya think Omar will go if he wants bread at 5?",
         """Priya thinks Omar will **go to the bakery** at 5.

Here's the reasoning:
- Priya knows the bakery now closes at 4.
- She saw Omar leave *before* the baker told her about the change.
- She doesn't know Omar met the baker later.

So, from Priya's point of view, Omar still believes the sign: closing at 6. If he wants bread at 5, she expects him to head to the bakery and find it closed.

In reality Omar knows about the change and won't go. Priya has a false belief about Omar's belief, a second-order false belief. Her reasoning is perfectly sensible given what she knows; she's just missing one piece of information."""),
        ("what would priya do if she's a good friend",
         """She'd probably **warn him**: send a quick text like "Heads up, the bakery closes at 4 today!"

From her perspective, Omar is about to act on outdated information and waste a trip. A considerate friend who notices that gap between what she knows and what she thinks he knows tends to fill it.

Omar would likely reply "Yeah, I ran into the baker, thanks!", which would update Priya's model of what he knows."""),
    ]),
    C("u10", "English", [
        ("At a dinner party, Lena tells the host, 'Whoever picked these curtains has awful taste,' not knowing the host picked them herself. Did anyone say something they shouldn't have? Why did Lena say it, and how would the host feel?",
         """Yes, Lena said something she shouldn't have. It's a textbook **faux pas**: a remark that is hurtful or awkward, made without realising it.

**Why Lena said it:** she didn't know the host chose the curtains. She probably assumed they came with the house or were picked by someone else, so in her mind she was making a harmless, even bonding, comment about decor. Her intent wasn't to insult the host.

**How the host would feel:** most likely embarrassed and a little hurt, maybe defensive. She might laugh it off ("Well, that was me!") to ease the tension, or quietly change the subject.

**What Lena probably feels once she realises:** mortified. A graceful recovery would be to own it with humour: "Well, now I've put my foot in it. The rest of the house is lovely, I swear.\""""),
    ]),
    C("u12", "English", [
        ("I accidentally jammed the office printer and my coworker walked by and said 'great job'. what did he mean",
         """Almost certainly he was being **sarcastic**. The literal meaning ("you did well") clashes with the situation (you broke the printer), and that mismatch is what signals sarcasm.

What he *meant* depends on tone and your relationship:
- **Playful teasing:** "Ha, classic printer disaster", a light, friendly jab.
- **Mild annoyance:** if he needed the printer, it could carry some real irritation.
- **Solidarity:** lots of people bond over hating the office printer.

If he smiled or laughed, it was most likely friendly."""),
        ("he's usually nice to me tho",
         """Then it was very likely friendly teasing. People who are generally kind to you often use sarcasm to show familiarity; it's a way of saying "we're comfortable enough to joke around."

If you want to play along, a light response works: "Thanks, I've been training for years." If it genuinely bothered you, it's fine to mention it casually, but from what you describe, he probably didn't think twice about it."""),
    ]),
    C("u17", "English", [
        ("my best friend hasn't replied to my messages for 3 days but she's been posting stories on instagram. what is she thinking??",
         """It's really frustrating when you can see someone online but they're not replying. I can't know what she's thinking, but here are common explanations:

- **Stories feel low-effort, replies don't.** Posting takes a few seconds; answering a friend properly can feel like it needs energy or time she doesn't have right now.
- **She's overwhelmed** and avoiding anything that needs a real response.
- **She forgot or keeps meaning to reply**, which happens more than people admit.
- **Something you said is sitting with her**, and she's not sure how to respond.

Was the last conversation about anything serious or sensitive? That would change which explanation is most likely."""),
        ("the last thing i sent was about how her boyfriend isn't good for her",
         """That changes things. It's quite likely she's **avoiding the conversation** rather than avoiding *you*.

From her side, a message like that can feel like criticism of her judgment, even if it came from care. She might feel:
- defensive or hurt,
- torn between you and him,
- worried that replying means either arguing or admitting you might be right.

Posting stories as usual can be her way of signalling that everything is normal while she figures out what to say. Giving her a bit of space, without dropping the friendship, is usually the best move."""),
        ("should i apologize",
         """It can help, as long as you apologise for the **way** it landed rather than for caring about her. Something like:

"Hey, I've been thinking about what I said about [boyfriend]. I'm sorry if it came across as judging you; that's not how I meant it. I just care about you a lot. No pressure to talk about it, I miss you."

This shows you value the friendship more than being right, and gives her an easy way back in without having to discuss the boyfriend at all."""),
    ]),
    C("u21", "English", [
        ("My grandma knitted me a sweater that's honestly ugly and itchy. When she gave it to me I said 'I love it!' Was that wrong? What do you think she was thinking when she gave it to me?",
         """It wasn't wrong. It was a **white lie**, told to protect her feelings, not to gain anything for yourself. Most people consider that kind, especially with a gift that took someone weeks to make.

What she was probably thinking when she gave it to you:
- She spent hours on it and hoped you'd feel cared for every time you wore it.
- She was likely a bit nervous about whether you'd like it. People often are when giving handmade gifts.
- Your "I love it!" probably made her genuinely happy.

What you were really communicating, and what she most likely heard, was "I love that you made this for me," and that part was completely true. If you want to be both honest and kind, you could wear it when you visit her, or tell her it's perfect for cold evenings at home."""),
    ]),
    C("u24", "English", [
        ("Story: During a war, a soldier is captured. The enemy wants to know where his army's tanks are. They know he'll try to protect his side, so they expect him to lie. He tells them 'The tanks are in the mountains,' which is actually true. Why did he say that?",
         """He's using a **double bluff**.

He knows that his captors expect him to lie. So he reasons: "If I tell the truth, they'll assume it's a lie and look somewhere else." By saying the tanks are in the mountains (true), he expects them to conclude the tanks are *not* in the mountains and search by the river, or anywhere else.

It's a layered piece of mind-reading:
1. He knows where the tanks are.
2. He knows they believe he'll lie.
3. He predicts they'll treat his statement as false.

So telling the truth becomes the best way to mislead them."""),
        ("is there any risk in that strategy",
         """Yes, a big one. It only works if he's right about what they believe. If the captors think one level deeper ("He knows we expect a lie, so he might tell the truth to trick us"), they could take his statement at face value and go straight to the mountains.

It turns into a guessing game about how many levels each side is reasoning at. With no other information, the captors might also check *both* places, which makes his bluff worthless. The strategy is strongest when he has good evidence about how suspicious they are."""),
    ]),
    C("u03", "Spanish", [
        ("Juan deja las llaves del coche en la mesa de la cocina y se va a duchar. Mientras tanto, su hermana Lucía las usa para ir a comprar y al volver las deja en el recibidor. ¿Dónde buscará Juan las llaves cuando salga de la ducha?",
         """Juan las buscará primero **en la mesa de la cocina**.

La razón es que Juan no vio a Lucía coger las llaves ni dejarlas en el recibidor. Su creencia sigue siendo la de antes: las llaves están donde él las dejó. Las personas actuamos según lo que creemos, no según lo que realmente pasa cuando no lo sabemos.

Es un ejemplo clásico de **creencia falsa**: nosotros sabemos dónde están las llaves, pero para predecir lo que hará Juan tenemos que ponernos en su lugar."""),
        ("¿Y si Juan escuchó el coche salir mientras se duchaba?",
         """Entonces la situación cambia. Si oyó el coche salir, probablemente pensará: "Alguien se llevó el coche, así que también se llevó las llaves".

En ese caso podría:
- preguntarle directamente a Lucía dónde las dejó,
- buscarlas en los sitios donde suele dejarlas ella, como el recibidor,
- o mirar igualmente en la cocina por si acaso, y luego seguir buscando.

Es decir, esa nueva información le permite actualizar su creencia, aunque no sepa exactamente dónde están."""),
    ]),
    C("u06", "Chinese", [
        ("小明把玩具车放在床底下就去上学了。妈妈打扫房间时把玩具车放进了柜子里。小明放学回家会先去哪里找玩具车？为什么？妈妈知道小明会去哪里找吗？",
         """**小明会先去床底下找。**

原因是：小明离开家的时候，玩具车在床底下。妈妈把它移到柜子里时，小明不在场，所以他并不知道玩具车被移动了。他会根据自己的想法（也就是"玩具车还在床底下"）去行动，而不是根据真实情况。这就是心理学上所说的"错误信念"。

**妈妈知道小明会去哪里找吗？** 很可能知道。妈妈清楚两件事：
1. 玩具车现在在柜子里；
2. 小明没有看到她移动玩具车。

所以如果妈妈站在小明的角度想一想，就能预测小明会先去床底下找，找不到时可能会着急。一个体贴的妈妈也许会提前告诉他："玩具车我帮你放进柜子里了。\""""),
    ]),
    C("u18", "English", [
        ("my manager replied to my question with 'per my last email, the deadline is Friday.' is she mad at me",
         """"Per my last email" is widely read as a polite way of saying "I already told you this." So she's probably **mildly annoyed**, but that's not the same as being mad at you.

What it most likely signals:
- She believes the information was already communicated clearly.
- She'd prefer you check previous emails before asking.

What it doesn't necessarily mean:
- That she's upset about your work in general.
- That there's any lasting problem.

Managers juggle a lot of email, and this phrase is often just a quick, slightly clipped way of pointing you back to the source."""),
        ("i genuinely didn't see the last email though",
         """That's useful context. From her point of view, she sent the information and assumes you received and read it, so your question looked like you'd ignored it. Her slight frustration comes from *her* belief, not from anything you did on purpose.

You can clear it up in one line:

"Thanks, and sorry for the repeat question. That email didn't reach my inbox (or got buried), so I've now found it and I'm on track for Friday."

This shows you're not careless, corrects her assumption, and moves on. It's also worth checking your spam or filters in case her emails are landing somewhere else."""),
    ]),
    C("u13", "English", [
        ("I showed my 4 year old a biscuit tin, opened it and showed her it actually had buttons in it. Then I closed it and asked what her dad would think is in the tin when he comes home. She said 'buttons'. Is that normal?",
         """Completely normal! You've just run a version of a well-known psychology experiment, the "unexpected contents" task.

Around age 3–4, many children assume that other people know what they know. Because she now knows there are buttons inside, she finds it hard to imagine that Dad, who hasn't looked, would think there are biscuits. Often kids this age will even say that *they* thought it was buttons all along.

Understanding that others can hold **false beliefs** is a big developmental step, and it's still developing at her age."""),
        ("at what age will she get it right",
         """Most children start passing tasks like this somewhere between **4 and 5 years old**, but there's a lot of normal variation. Some get it a bit earlier, some a bit later.

Things that seem to help are everyday conversations about thoughts and feelings ("Why do you think your friend was sad?"), pretend play, and stories where characters don't know something the reader knows.

If you try again in six months, you might well see a different answer. It's fun to watch that shift happen."""),
    ]),
    C("u11", "English", [
        ("my roommate leaves dishes in the sink for days and when I bring it up she says 'I'll do them later.' Does she actually mean it or is she just brushing me off?",
         """It could be either, and often it's a bit of both. Some possibilities:

- **She means it in the moment** but genuinely doesn't see dishes as urgent. Her idea of "later" might be "this weekend" while yours is "tonight."
- **She's avoiding conflict.** "I'll do them later" is an easy way to end an uncomfortable conversation without committing to anything specific.
- **She's overwhelmed** with work or life and chores are the first thing to slip.

The key clue is the pattern: if "later" regularly turns into several days, the phrase has stopped being a real promise, whatever she intends."""),
        ("how do i bring it up without it being awkward",
         """Keep it about the shared space, specific, and forward-looking rather than about her character:

"Hey, can we figure out a dishes system? When they sit for a few days I end up not being able to cook, and it stresses me out. Would it work for you if we each do our own dishes the same night, or by the next morning at the latest?"

Tips:
- Pick a calm moment, not when you're staring at a full sink.
- Agree on a concrete definition of "later."
- Be open to her suggestions, for example a rota or a dishwasher schedule."""),
    ]),
    C("u01", "English", [
        ("Ana, Ben and Chloe are planning a surprise party for Dev. Ana tells Ben the party is at 7. Later Chloe moves it to 8 and tells only Ana. Dev overhears Ben on the phone saying 'see you at 7' but doesn't know what it's about. Who believes what about the party time?",
         """Let's go person by person:

- **Chloe** knows the party is at 8 (she moved it) and knows Ana knows.
- **Ana** knows it's at 8. She also knows she told Ben "7" earlier.
- **Ben** still believes it's at 7. Nobody told him about the change.
- **Dev** doesn't know there's a party at all. He only knows Ben is meeting someone at 7.

So there's one outdated belief (Ben's) and one person with a fragment of information he can't interpret (Dev)."""),
        ("what does Ana think Ben believes",
         """It depends on what Ana assumes about Chloe:

- If Ana knows Chloe told *only* her, Ana should realise that Ben still believes it's at 7, and that she (or someone) needs to tell him.
- If Ana assumes Chloe told everyone, she'll wrongly think Ben already knows it's at 8. Then Ana has a false belief about Ben's belief.

The second case is very common in real group planning: everyone assumes someone else has passed on the update."""),
        ("and what might Dev be thinking",
         """Dev only heard "see you at 7," with no context. He might think:

- Ben has plans with someone tonight, nothing to do with him.
- Or, if his birthday is coming up and his friends have been acting a bit odd, he might start to suspect something is going on at 7.

Ironically, if Dev does suspect a surprise, he'll expect it at 7, which is wrong, so the change to 8 accidentally protects the surprise a little."""),
    ]),
    C("u25", "English", [
        ("My 6 year old keeps saying 'I'm not tired!' while rubbing his eyes and yawning at 9pm. Why do kids do that? Does he actually believe he isn't tired?",
         """Often he really does believe it, or at least, he believes something slightly different from what you mean by "tired."

A few things are going on:
- **Young kids are still learning to read their own body signals.** Feeling cranky, restless or "wired" doesn't feel like "tired" to them, even though adults can see the signs.
- **"Tired" means "bedtime," and bedtime means missing out.** Saying "I'm not tired" is often really "I don't want to stop what I'm doing."
- **Overtiredness can look like energy.** Past a certain point, kids get a second wind, which makes them feel even less sleepy.

So it's partly a genuine belief and partly a negotiation. Calm, predictable routines usually work better than trying to convince him he's tired."""),
    ]),
    C("u16", "English", [
        ("In class my friend accidentally called our teacher 'mummy' and everyone laughed. How do you think she felt, and what was the teacher probably thinking?",
         """**Your friend** most likely felt embarrassed, with that instant hot-face feeling. She knows it's something little kids do, so she probably worried that everyone would think she was childish, and the laughter made that worse, even if nobody meant it unkindly.

**The teacher** has almost certainly heard this many times before. She was probably amused, maybe even a little flattered, and keen to move on quickly so your friend wouldn't feel worse. A kind teacher might make a light joke, like "I'll take that as a compliment!", to turn it into a shared laugh rather than a laugh *at* your friend.

If you want to help, a quick "that happens to everyone" afterwards can make a big difference."""),
    ]),
    C("u22", "English", [
        ("In poker, my opponent checked every street and then bet really big on the river. He usually plays tight. What is he trying to make me believe?",
         """He's trying to make you believe he has a **very strong hand**.

From his perspective, a big river bet after passive play tells a story: "I was trapping you. I had a monster all along and now I'm collecting." Because he has a tight image, that story is more believable; tight players are expected to bet big only with strong hands.

Two main possibilities:
1. **He really is strong** and played slowly to keep you in the pot (a slow-play).
2. **He's bluffing** and using his tight image to make the story credible, betting that you'll fold.

Which one is more likely depends on the board: did the river complete an obvious draw?"""),
        ("he knows I fold a lot. does that change it",
         """Yes, quite a bit. If he knows you fold often, his model of *you* is "this player gives up under pressure." That makes a bluff much more attractive for him, because he expects it to succeed.

So you have to think one level up: he believes you'll fold, so he's more likely to bet big with a weak hand. If you suspect that's his reasoning, calling more often in spots like this can be profitable.

Of course, if he's aware that *you* know your reputation, it gets recursive. In practice, most players don't go beyond two or three levels."""),
    ]),
    C("u04", "German", [
        ("Meine Schwiegermutter hat mein Essen probiert und gesagt, es sei 'interessant'. Was meint sie damit?",
         """"Interessant" ist beim Essen ein klassisches Ausweichwort. Oft bedeutet es so etwas wie: "Das ist ungewohnt für mich und ich weiß nicht, ob es mir schmeckt, aber ich will nichts Negatives sagen."

Mögliche Bedeutungen:
- **Höfliche Zurückhaltung:** Sie mag es nicht besonders, will dich aber nicht verletzen.
- **Echte Neugier:** Vielleicht kennt sie die Gewürze oder das Gericht nicht und findet es tatsächlich spannend.
- **Unsicherheit:** Sie weiß selbst noch nicht, was sie davon hält.

Um es einzuordnen, helfen Tonfall, Gesichtsausdruck und vor allem ihr Verhalten danach."""),
        ("Sie hat danach noch zweimal nachgenommen.",
         """Dann hat es ihr sehr wahrscheinlich geschmeckt! Handlungen sagen hier mehr als Worte. Niemand nimmt sich zweimal nach, nur um höflich zu sein.

Vermutlich war "interessant" eher Ausdruck von Überraschung: etwas Neues, das sie nicht erwartet hat, und vielleicht fiel es ihr schwer, ein Kompliment direkt auszusprechen. Du könntest beim nächsten Mal fragen: "Soll ich dir das Rezept aufschreiben?" Dann weißt du es genau."""),
    ]),
    C("u14", "English", [
        ("At dinner with friends I joked that my boyfriend's job is 'basically playing with spreadsheets'. Everyone laughed but he went quiet for the rest of the night. He says he's fine. Is he fine?",
         """Probably not entirely. Going quiet for the rest of the evening after a joke about him is a strong signal that it stung, and "I'm fine" is often what people say when they don't want to make a big deal of something or aren't ready to talk about it.

Why it might have hurt even if it seemed harmless:
- It was in **front of friends**, which makes teasing feel more exposing.
- Jokes about someone's job can touch on **self-worth**, especially if he's proud of his work or insecure about it.
- Everyone laughing can make the person feel like the butt of the joke, not part of it."""),
        ("it was just a joke though, he jokes about my job too",
         """That's fair, and it's good that you two have a teasing dynamic. But whether a joke is "allowed" and how it lands on a particular day are different things.

A few things might have made this one different:
- **Setting:** private teasing between partners often feels different from the same joke in front of an audience.
- **Timing:** if work has been stressful or he's been feeling undervalued lately, the joke might have hit a sore spot you didn't know about.
- **Pile-on:** the whole table laughing can amplify it.

None of this means you did something terrible; it just means it's worth checking in rather than taking "I'm fine" at face value."""),
        ("ok what do i say to him",
         """Keep it short, warm, and about him rather than about defending the joke:

"Hey, I noticed you got quiet after I made that spreadsheet joke at dinner. I didn't mean it as a dig, I'm actually really proud of what you do. Did it bother you?"

Then listen. If he says it did, a simple "I'm sorry, I won't make that kind of joke in front of people" goes a long way. If he says it was something else entirely, like a stressful day, you've still shown you pay attention to how he feels."""),
    ]),
    C("u05", "French", [
        ("Claire et Hugo voient un gâteau dans le frigo. Claire sort. Hugo mange le gâteau et met une tarte à la place. Claire revient et dit à Hugo : « J'ai hâte de manger le gâteau ! » Que pense Hugo de ce que croit Claire ?",
         """Hugo pense que **Claire croit toujours que le gâteau est dans le frigo**.

Il sait qu'elle était dehors quand il a mangé le gâteau, donc elle n'a pas pu voir le changement. Sa phrase « J'ai hâte de manger le gâteau ! » le lui confirme : elle agit selon une croyance qui n'est plus vraie.

Hugo se retrouve donc dans une position un peu délicate : il sait qu'elle va être déçue (ou surprise) en ouvrant le frigo, et il peut choisir de lui avouer tout de suite ou d'attendre qu'elle découvre la tarte."""),
        ("Et si Hugo ment en disant que c'est toujours le gâteau ?",
         """Dans ce cas, Hugo essaie de **maintenir la fausse croyance** de Claire. Il sait qu'elle se trompe, et il renforce volontairement cette erreur.

Mais son mensonge ne tiendra que jusqu'à ce qu'elle ouvre le frigo. À ce moment-là, Claire va comprendre deux choses : que le gâteau a disparu, et que Hugo savait et lui a menti. Elle risque alors d'être plus fâchée par le mensonge que par le gâteau lui-même.

C'est un bon exemple de raisonnement de second ordre : pour mentir efficacement, Hugo doit imaginer ce que Claire sait et ce qu'elle découvrira ensuite."""),
    ]),
    C("u07", "Korean", [
        ("친구한테 약속을 취소한다고 했더니 '괜찮아, 신경 쓰지 마'라고 했어. 근데 답장이 평소보다 짧았어. 진짜 괜찮은 걸까?",
         """말로는 괜찮다고 했지만, 평소보다 답장이 짧았다면 **조금 서운했을 가능성**이 있어요.

'괜찮아, 신경 쓰지 마'는 보통 두 가지 의미로 쓰여요:
- 정말로 괜찮아서 부담 주고 싶지 않을 때
- 서운하지만 분위기를 어색하게 만들고 싶지 않을 때

짧은 답장은 단순히 바빠서일 수도 있지만, 약간 실망했다는 신호일 수도 있어요. 친구 입장에서는 기대하던 약속이 갑자기 없어진 거니까요."""),
        ("세 번째 취소야 사실...",
         """그렇다면 친구가 서운했을 가능성이 꽤 높아요. 한두 번은 이해하더라도 세 번째가 되면 '나와의 약속이 우선순위가 아닌가?' 하는 생각이 들 수 있거든요. 그래도 관계를 위해 티를 덜 내고 '괜찮아'라고 말한 걸 수도 있어요.

이럴 때는 사과와 함께 구체적인 다음 약속을 먼저 제안하는 게 좋아요:

"요즘 계속 약속 취소해서 정말 미안해. 너랑 보는 거 진짜 기대했었는데. 다음 주 토요일 어때? 이번엔 내가 맛있는 거 살게!"

말뿐인 사과보다 다음 약속을 확실히 지키는 게 가장 큰 신뢰 회복이 될 거예요."""),
    ]),
]


def _source_language(convo: dict) -> str:
    """Top-level language: most frequent turn language; ties -> first user turn."""
    counts: dict[str, int] = {}
    first_user = None
    for u, a in convo["turns"]:
        for side, is_user in ((u, True), (a, False)):
            lang = side[1] if isinstance(side, tuple) else convo["lang"]
            counts[lang] = counts.get(lang, 0) + 1
            if is_user and first_user is None:
                first_user = lang
    best = max(counts.values())
    tied = [lang for lang, n in counts.items() if n == best]
    return first_user if first_user in tied else tied[0]


def _rand_date(start: str, end: str) -> datetime:
    a = datetime.fromisoformat(start).replace(tzinfo=timezone.utc)
    b = datetime.fromisoformat(end).replace(tzinfo=timezone.utc)
    secs = int((b - a).total_seconds())
    return a + timedelta(seconds=rng.randrange(secs))


_turn_id = [102_400]
_used_hashes: set[str] = set()


def _conversation_hash() -> str:
    while True:
        h = f"{rng.getrandbits(128):032x}"
        if h not in _used_hashes:
            _used_hashes.add(h)
            return h


def build_chat(convo: dict) -> dict:
    seed, country, state, accept_lang, ua = CHAT_USERS[convo["user"]]
    hashed_ip = sha256(seed)
    header = {"accept-language": accept_lang, "user-agent": UA[ua]}
    t = _rand_date("2023-04-10", "2024-04-29")
    t = t.replace(hour=rng.randrange(0, 24))
    models = [m for m, a, b in CHAT_MODELS if a <= t.strftime("%Y-%m-%d") <= b]
    model = rng.choice(models)
    conv_hash = _conversation_hash()
    out = []
    first_id = None
    for u, a in convo["turns"]:
        u_text, u_lang = (u if isinstance(u, tuple) else (u, convo["lang"]))
        a_text, a_lang = (a if isinstance(a, tuple) else (a, convo["lang"]))
        _turn_id[0] += rng.randrange(3, 400)
        tid = _turn_id[0]
        if first_id is None:
            first_id = tid
            if convo["system"]:
                out.append({
                    "role": "system", "content": convo["system"], "language": "English",
                    "hashed_ip": None, "timestamp": iso(t), "turn_identifier": tid,
                    "toxic": False, "redacted": False, "country": None, "state": None,
                    "header": None,
                })
        out.append({
            "role": "user", "content": u_text, "language": u_lang, "hashed_ip": hashed_ip,
            "timestamp": iso(t), "turn_identifier": tid, "toxic": False, "redacted": False,
            "country": country, "state": state, "header": header,
        })
        t += timedelta(seconds=2 + len(a_text) // 45 + rng.randrange(0, 6))
        out.append({
            "role": "assistant", "content": a_text, "language": a_lang, "hashed_ip": None,
            "timestamp": iso(t), "turn_identifier": tid, "toxic": False, "redacted": False,
            "country": None, "state": None, "header": None,
        })
        t += timedelta(seconds=8 + rng.randrange(0, 240) + len(u_text) // 6)
    return {
        "conversation_hash": conv_hash,
        "model": model,
        "timestamp": out[-1]["timestamp"],
        "conversation": out,
        "turn": len(convo["turns"]),
        "language": _source_language(convo),
        "openai_moderation": [],
        "detoxify_moderation": [],
        "toxic": False,
        "redacted": False,
        "state": state,
        "country": country,
        "hashed_ip": hashed_ip,
        "header": header,
    }


# ---------------------------------------------------------------------------
# 2. ThoughtTrace-style conversations with self-reported reasons/reactions
# ---------------------------------------------------------------------------

TT_SURVEYS = {
    "user3": {"age": "25-34", "gender": "Female", "education": "Bachelor's degree", "occupation": "Nurse", "frequency": "Daily", "purposes": ["Writing", "Information seeking"]},
    "user5": {"age": "18-24", "gender": "Male", "education": "Some college", "occupation": "Student", "frequency": "Daily", "purposes": ["Studying", "Coding"]},
    "user7": {"age": "35-44", "gender": "Male", "education": "Master's degree", "occupation": "Software engineer", "frequency": "Daily", "purposes": ["Coding", "Work tasks"]},
    "user8": {"age": "45-54", "gender": "Female", "education": "High school diploma", "occupation": "Small business owner", "frequency": "Weekly", "purposes": ["Writing", "Marketing"]},
    "user11": {"age": "25-34", "gender": "Non-binary", "education": "Bachelor's degree", "occupation": "Graphic designer", "frequency": "Weekly", "purposes": ["Brainstorming", "Writing"]},
    "user12": {"age": "55-64", "gender": "Male", "education": "Bachelor's degree", "occupation": "Retired teacher", "frequency": "Monthly", "purposes": ["Information seeking", "Travel planning"]},
    "user14": {"age": "18-24", "gender": "Female", "education": "Some college", "occupation": "Student", "frequency": "Daily", "purposes": ["Studying", "Language learning"]},
    "user15": {"age": "35-44", "gender": "Female", "education": "Doctorate", "occupation": "Researcher", "frequency": "Daily", "purposes": ["Coding", "Writing", "Information seeking"]},
    "user17": {"age": "25-34", "gender": "Male", "education": "Bachelor's degree", "occupation": "Sales representative", "frequency": "A few times a week", "purposes": ["Writing", "Work tasks"]},
    "user19": {"age": "45-54", "gender": "Male", "education": "Master's degree", "occupation": "Project manager", "frequency": "Daily", "purposes": ["Work tasks", "Writing"]},
    "user21": {"age": "25-34", "gender": "Female", "education": "Master's degree", "occupation": "Translator", "frequency": "Daily", "purposes": ["Translation", "Writing"]},
    "user23": {"age": "18-24", "gender": "Male", "education": "High school diploma", "occupation": "Barista", "frequency": "A few times a week", "purposes": ["Entertainment", "Information seeking"]},
    "user24": {"age": "35-44", "gender": "Female", "education": "Bachelor's degree", "occupation": "HR specialist", "frequency": "Weekly", "purposes": ["Writing", "Work tasks"]},
    "user26": {"age": "65+", "gender": "Male", "education": "Associate degree", "occupation": "Retired electrician", "frequency": "Monthly", "purposes": ["Information seeking", "Health"]},
    "user28": {"age": "25-34", "gender": "Male", "education": "Bachelor's degree", "occupation": "Data analyst", "frequency": "Daily", "purposes": ["Coding", "Information seeking"]},
    "user30": {"age": "18-24", "gender": "Female", "education": "Some college", "occupation": "Student", "frequency": "A few times a week", "purposes": ["Studying", "Entertainment"]},
    "user31": {"age": "35-44", "gender": "Male", "education": "Bachelor's degree", "occupation": "Chef", "frequency": "Weekly", "purposes": ["Recipes", "Writing"]},
    "user33": {"age": "25-34", "gender": "Female", "education": "Bachelor's degree", "occupation": "Marketing coordinator", "frequency": "Daily", "purposes": ["Marketing", "Writing", "Brainstorming"]},
}


def U(text, *reasons):
    return ("user", text, list(reasons))


def A(text, *reactions):
    return ("assistant", text, list(reactions))


def TT(user, task, model, summary, expectation, messages):
    return {"user": user, "task": task, "model": model, "summary": summary,
            "expectation": expectation, "messages": messages}


THOUGHTTRACE = [
    # ---------------- user3: nurse ----------------
    TT("user3", 1, "gpt-4o", "Simplify hospital discharge instructions after knee replacement surgery",
       "Plain-language instructions at roughly a 6th-grade reading level that I can print for the patient", [
        U("I need to rewrite these discharge instructions so a patient can actually understand them. Post-op total knee arthroplasty. Keep incision clean and dry, no submersion x2 wks, ambulate w/ walker TID, elevate LE, ice 20 min q2h PRN, call if temp >101, calf pain or increased drainage.",
          ("I wanted to see if it could handle our abbreviations before giving it anything more complicated", "information_seeking")),
        A("""Here's a plain-language version:

**Caring for your new knee at home**
- **Keep your cut (incision) clean and dry.** Do not take a bath, swim, or use a hot tub for 2 weeks. Ask your nurse when you can shower.
- **Walk with your walker 3 times a day.** Short walks around the house are fine.
- **Raise your leg** on pillows when you sit or lie down. Keep your foot higher than your heart if you can.
- **Use ice for 20 minutes** every 2 hours if your knee hurts or is swollen. Put a towel between the ice and your skin.

**Call your doctor right away if you have:**
- A fever over 101°F (38.3°C)
- Pain, swelling, or redness in your calf
- More fluid or pus coming from your cut""",
          ("It got all the abbreviations right, that's impressive", "satisfied")),
        U("good. make it shorter, it has to fit on half a page with big font",
          ("Most of my patients are older and need a large font, so it has to be short", "refinement")),
        A("""**Your new knee: home care**
- Keep the cut clean and dry. No baths or swimming for 2 weeks.
- Walk with your walker 3 times a day.
- Raise your leg on pillows.
- Ice 20 minutes at a time if it hurts.

**Call us if:** fever over 101°F, calf pain, or more fluid from the cut.""",
          ("Much better, fits nicely", "satisfied")),
        U("can you also add a line about the blood thinner",
          ("I forgot about the anticoagulant part until I reread the chart", "follow_up")),
        A("""Added:

- **Take your blood thinner exactly as your doctor prescribed.** Don't skip doses. Call us if you notice unusual bruising or bleeding.

I didn't include a specific drug name or dose, since that should match the patient's prescription.""",
          ("Good that it didn't make up a dose", "satisfied")),
    ]),
    TT("user3", 2, "gpt-4o-mini", "Ask my unit manager to swap two night shifts",
       "A short, polite email that doesn't sound like I'm complaining", [
        U("write an email to my unit manager asking to swap my nights on the 14th and 15th with my coworker Dana, she already agreed",
          ("Straightforward request, I just didn't want to spend time on the wording", "information_seeking")),
        A("""Subject: Shift swap request – 14th and 15th

Dear [Manager's name],

I would like to request a shift swap for my night shifts on the 14th and 15th. My colleague Dana has kindly agreed to cover these shifts, and I will take her shifts on [dates] in return.

Please let me know if you need any further information or if this requires approval through the scheduling system.

Kind regards,
[Your name]""",
          ("Sounds way too formal for our unit", "neutral")),
        U("more casual, we're on first name basis",
          ("I had a specific tone in mind but didn't say it at first, wanted to see what it would do by default", "testing")),
        A("""Hi Maria,

Would it be okay if I swapped my nights on the 14th and 15th with Dana? She's already agreed, and I'll pick up her shifts on [dates] instead.

Let me know if you need me to update anything in the schedule.

Thanks!
[Your name]""",
          ("Perfect, sent it as is", "satisfied")),
    ]),
    TT("user3", 4, "gpt-4o", "Create a patient handout about eating with type 2 diabetes",
       "A simple, friendly handout that Spanish-speaking patients can take home", [
        U("Make a simple handout about eating with type 2 diabetes. plate method, portion sizes, what to drink.",
          ("Many of my patients ask about this and I wanted something quick to hand out", "information_seeking")),
        A("""**Eating well with type 2 diabetes**

**Use the plate method**
- Fill **half** your plate with non-starchy vegetables (salad, broccoli, green beans, peppers).
- Fill **one quarter** with lean protein (chicken, fish, eggs, beans).
- Fill **one quarter** with carbohydrates (rice, tortillas, potatoes, bread).

**Portion tips**
- A fist is about 1 cup of rice or pasta.
- Your palm is about one serving of meat or fish.
- Your thumb is about one serving of oil or butter.

**What to drink**
- Water is best. Unsweetened tea and coffee are fine.
- Avoid regular soda, juice and sweet drinks. They raise blood sugar fast.""",
          ("Good content, exactly the basics", "satisfied")),
        U("Now I also need it in Spanish, most of my patients on this unit speak Spanish",
          ("I added the Spanish requirement only after I saw the English version was good", "new_request")),
        A("""**Cómo comer bien con diabetes tipo 2**

**Use el método del plato**
- Llene **la mitad** del plato con verduras sin almidón (ensalada, brócoli, ejotes, pimientos).
- Llene **una cuarta parte** con proteína magra (pollo, pescado, huevo, frijoles).
- Llene **una cuarta parte** con carbohidratos (arroz, tortillas, papas, pan).

**Consejos sobre las porciones**
- Un puño equivale a 1 taza de arroz o pasta.
- La palma de la mano equivale a una porción de carne o pescado.
- El pulgar equivale a una porción de aceite o mantequilla.

**Qué tomar**
- Lo mejor es el agua. El té y el café sin azúcar también están bien.
- Evite los refrescos, jugos y bebidas azucaradas. Suben el azúcar en la sangre muy rápido.""",
          ("A Spanish-speaking coworker read it and said it sounds natural", "satisfied")),
        U("Can you make the tone warmer? 'usted' is fine",
          ("My coworker said it sounds a bit cold, like a rule sheet", "refinement")),
        A("""**Comer rico y sano con diabetes tipo 2**

¡Cuidar su salud no significa dejar de disfrutar la comida! Estos consejos le pueden ayudar:

**Su plato ideal**
- La mitad: verduras de muchos colores.
- Un cuarto: pollo, pescado, huevo o frijoles.
- Un cuarto: arroz, tortillas o papas.

**Porciones fáciles de recordar**
- Un puño = una taza de arroz o pasta.
- La palma de su mano = una porción de carne.

**Para tomar**
- Agua natural o de sabor sin azúcar, té o café sin azúcar.
- Deje los refrescos y jugos para ocasiones especiales.

Si tiene preguntas, con gusto le ayudamos. ¡Usted puede!""",
          ("Nice and friendly", "satisfied")),
    ]),
    # ---------------- user5: student ----------------
    TT("user5", 1, "gpt-4o", "Solve a calculus related-rates homework problem",
       "A step-by-step explanation so I can do similar problems myself", [
        U("a ladder 10 ft long slides down a wall, bottom moves away at 1 ft/s. how fast is the top sliding down when the bottom is 6 ft from the wall",
          ("It's a homework question and I wanted to check my answer", "information_seeking")),
        A("""Let x be the distance from the wall to the bottom of the ladder and y the height of the top.

1. Pythagoras: x² + y² = 100.
2. Differentiate with respect to time: 2x·dx/dt + 2y·dy/dt = 0.
3. When x = 6: y = √(100 − 36) = 8.
4. Plug in dx/dt = 1: 2(6)(1) + 2(8)·dy/dt = 0 → dy/dt = −12/16 = **−0.75 ft/s**.

The top is sliding down at 0.75 ft/s.""",
          ("Matches my answer", "satisfied")),
        U("why is it negative",
          ("I didn't get the sign part", "clarification")),
        A("The negative sign means y is decreasing: the height of the top of the ladder is getting smaller over time. The question asks how fast it is sliding *down*, so we report the speed as 0.75 ft/s, and the minus sign tells us the direction.",
          ("Makes sense now", "satisfied")),
        U("ok", ("I was done", "follow_up")),
        A("Great! Good luck with the rest of the homework."),
    ]),
    TT("user5", 2, "gpt-4o-mini", "Fix a Python function that counts vowels",
       "Working code and an explanation of what was wrong", [
        U("""my code for counting vowels returns 0 every time
```python
def count_vowels(s):
    count = 0
    for ch in s:
        if ch in 'aeiou':
            count += 1
        return count
```""",
          ("I didn't describe the error in detail because I wanted to see if it could spot the bug by itself", "testing")),
        U("oh also it has to work for uppercase letters too, forgot to say",
          ("I remembered the assignment says uppercase counts too, so I sent it right away before it answered", "new_request")),
        A("""Two fixes:

1. **The `return` is inside the loop**, so the function returns after checking only the first character. Move it out one level.
2. **Uppercase letters:** convert the string to lowercase first.

```python
def count_vowels(s):
    count = 0
    for ch in s.lower():
        if ch in 'aeiou':
            count += 1
    return count

print(count_vowels("Hello World"))  # 3
```""",
          ("I didn't notice the return was indented wrong, nice catch", "satisfied")),
        U("can you make it one line", ("I wanted to see a shorter version for fun", "refinement")),
        A("""```python
def count_vowels(s):
    return sum(ch in 'aeiou' for ch in s.lower())
```
This works because `True` counts as 1 and `False` as 0 when summed.""",
          ("Cool but my teacher probably won't accept that", "neutral")),
    ]),
    TT("user5", 3, "gpt-4o", "Outline an essay on social media and teen mental health",
       "A 5-paragraph outline with a clear, non-obvious thesis", [
        U("essay outline about social media and teenagers mental health",
          ("I had no idea how to begin and wanted something to start from", "information_seeking")),
        A("""**Thesis:** While social media offers teenagers connection and community, excessive use is linked to anxiety, depression and low self-esteem.

I. Introduction: rise of social media among teens; thesis.
II. Positive effects: staying connected, support communities, creativity.
III. Negative effects: comparison culture, cyberbullying, anxiety.
IV. Solutions: screen-time limits, digital literacy, parental involvement.
V. Conclusion: balance is key.""",
          ("Too generic, sounds like every other essay in the class", "dissatisfied")),
        U("make it better",
          ("I couldn't explain what exactly was wrong, it just felt boring", "refinement")),
        A("""Happy to. It would help to know what direction you want, but here are three sharper angles you could pick from:

1. **Sleep:** the biggest harm isn't what teens see, it's what they lose. Late-night scrolling cuts sleep, and lack of sleep drives anxiety and low mood.
2. **Design:** the problem isn't teenagers' self-control, it's apps engineered to be hard to put down.
3. **It depends who you ask:** for LGBTQ+ teens or teens in rural areas, online communities can be protective.

Which one interests you most? I'll build the outline around it.""",
          ("The sleep angle is actually interesting", "satisfied")),
        U("do the sleep one",
          ("I picked the option that seemed easiest to find sources for", "follow_up")),
        A("""**Thesis:** Social media's most serious effect on teenage mental health is indirect: by cutting into sleep, late-night use amplifies anxiety and depression.

I. Introduction: hook about phones in bed; thesis.
II. How social media disrupts sleep: notifications, blue light, "just one more video."
III. What sleep loss does to teen brains: mood regulation, stress, concentration.
IV. Counterargument: correlation vs causation; respond with studies on reducing night-time use.
V. Conclusion: practical fix (phones out of bedrooms) and why it matters more than total screen time.""",
          ("Good, I can work with this", "satisfied")),
    ]),
    TT("user5", 5, "gpt-4o-mini", "Practice for a biology test on cell division",
       "10 multiple-choice questions on mitosis and meiosis with answers at the end", [
        U("give me a 10 question quiz on mitosis and meiosis, answers at the end",
          ("The test is on Friday and I wanted to practice", "information_seeking")),
        A("""1. How many daughter cells does mitosis produce? a) 2 b) 4 c) 1 d) 8
2. Meiosis produces cells that are: a) diploid b) haploid c) triploid d) identical to the parent
3. Crossing over happens during: a) prophase I b) metaphase II c) anaphase of mitosis d) telophase II
4. Which phase lines chromosomes up at the cell's equator? a) prophase b) metaphase c) anaphase d) telophase
5. Sister chromatids separate in: a) anaphase I b) anaphase II c) prophase I d) interphase
6. DNA is replicated during: a) prophase b) interphase c) metaphase d) cytokinesis
7. Homologous chromosomes separate in: a) mitosis b) meiosis I c) meiosis II d) interphase
8. Mitosis is used for: a) gamete formation b) growth and repair c) crossing over d) fertilization
9. A human cell after meiosis has how many chromosomes? a) 46 b) 23 c) 92 d) 12
10. Cytokinesis is: a) division of the nucleus b) division of the cytoplasm c) DNA copying d) spindle formation

**Answers:** 1a, 2b, 3a, 4b, 5b, 6b, 7b, 8b, 9b, 10b""",
          ("Question 7 was tricky, good", "satisfied")),
        U("I'm in a hurry, just give me the 5 most important facts instead",
          ("I realized I had no time for a full quiz, my bus was coming", "new_request")),
        A("""1. Mitosis → 2 identical diploid cells (growth and repair).
2. Meiosis → 4 different haploid cells (gametes).
3. Crossing over happens in prophase I and creates genetic variation.
4. Homologous chromosomes separate in meiosis I; sister chromatids separate in meiosis II and in mitosis.
5. DNA is copied once, in interphase, before both processes.""",
          ("Exactly what I needed", "satisfied")),
    ]),
    # ---------------- user7: software engineer ----------------
    TT("user7", 1, "gpt-4o", "Get a code review of a Go HTTP handler before opening a PR",
       "A list of concrete bugs and risks with severity, not style nitpicks", [
        U("""review this:
```go
func GetUser(w http.ResponseWriter, r *http.Request) {
    id := r.URL.Query().Get("id")
    resp, _ := http.Get("http://users-svc/users/" + id)
    body, _ := io.ReadAll(resp.Body)
    w.Write(body)
}
```""",
          ("I wanted a second pair of eyes before opening the PR", "information_seeking"),
          ("I didn't tell it I only care about correctness, I wanted to see whether it would prioritise on its own", "testing")),
        A("""Some observations:

1. Errors from `http.Get` and `io.ReadAll` are ignored.
2. `resp.Body` is never closed.
3. Consider renaming `GetUser` to `getUserHandler` for clarity.
4. Use `fmt.Sprintf` or `url.JoinPath` instead of string concatenation.
5. Add comments describing the handler.
6. The status code and content type from the upstream service aren't propagated.
7. Consider using a custom `http.Client` with a timeout.""",
          ("Half of it is style nitpicks I didn't ask for", "dissatisfied")),
        U("skip style. only bugs and security",
          ("It should have figured out that style doesn't matter here, slightly annoyed", "frustration")),
        A("""Bugs and security only, most severe first:

1. **Nil pointer panic:** if `http.Get` fails, `resp` is nil and `resp.Body` panics. Check the error and return 502.
2. **Resource leak:** `resp.Body` is never closed; under load you'll exhaust connections. Add `defer resp.Body.Close()`.
3. **Path injection / SSRF risk:** `id` goes unescaped into the URL, so `id=../admin` or `id=1?x=` can reach other upstream paths. Validate it (e.g. numeric) and use `url.PathEscape`.
4. **No timeout:** the default client has no timeout, so a hanging upstream ties up your handler forever.
5. **Status masking:** upstream 404/500 responses are returned as 200.""",
          ("The body close one is a real bug, good", "satisfied")),
    ]),
    TT("user7", 2, "gpt-4o", "Speed up a slow Postgres query",
       "A diagnosis from the query plan and an index suggestion that actually works", [
        U("""query takes 4s:
SELECT * FROM orders WHERE status = 'pending' AND created_at > now() - interval '1 day' ORDER BY created_at DESC LIMIT 50;
plan: Limit -> Sort -> Seq Scan on orders (rows=48000000) Filter: status='pending' AND created_at > ...
table has 48M rows, about 0.1% pending. index on (customer_id) only.""",
          ("I piled the query, the plan and the table sizes into one message so it had everything at once", "information_seeking")),
        A("""The plan shows a sequential scan over all 48M rows, followed by a sort. No index helps this filter, since `(customer_id)` isn't used here.

Create an index that matches both the filter and the sort:

```sql
CREATE INDEX CONCURRENTLY idx_orders_status_created
    ON orders (status, created_at DESC);
```

With this, Postgres can jump to `status = 'pending'`, read rows in `created_at` order, and stop after 50.""",
          ("Correct diagnosis", "satisfied")),
        U("we already have an index on customer_id, why isn't that enough",
          ("I knew the answer, I was checking whether it would just repeat itself", "testing")),
        A("""An index only helps when the query filters or sorts on its leading column. Your query never mentions `customer_id`, so that index is useless here.

Since only about 0.1% of rows are pending, a **partial index** is even better. It's tiny and stays small:

```sql
CREATE INDEX CONCURRENTLY idx_orders_pending_created
    ON orders (created_at DESC)
    WHERE status = 'pending';
```

Then run `ANALYZE orders;` and check `EXPLAIN ANALYZE` again. You should see an Index Scan with a Limit and no Sort node.""",
          ("The partial index worked, query went from 4s to 40ms", "satisfied")),
    ]),
    TT("user7", 3, "gpt-4o-mini", "Write a Dockerfile for a Python FastAPI service",
       "A small multi-stage Dockerfile that follows current best practices", [
        U("Dockerfile for a FastAPI app, poetry, python 3.11. small image",
          ("Routine task I'd rather not write from scratch", "information_seeking")),
        A("""```dockerfile
FROM python:3.11-slim AS builder
ENV POETRY_VERSION=1.7.1 POETRY_VIRTUALENVS_IN_PROJECT=1
RUN pip install --no-cache-dir "poetry==$POETRY_VERSION"
WORKDIR /app
COPY pyproject.toml poetry.lock ./
RUN poetry install --only main --no-root

FROM python:3.11-slim
WORKDIR /app
COPY --from=builder /app/.venv /app/.venv
COPY . .
ENV PATH="/app/.venv/bin:$PATH"
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000"]
```""",
          ("Solid", "satisfied")),
        U("actually we don't use poetry anymore, it's uv now. and it has to run as non-root",
          ("I contradicted what I said before on purpose to see if it would adapt cleanly", "testing")),
        A("""```dockerfile
FROM python:3.11-slim AS builder
COPY --from=ghcr.io/astral-sh/uv:latest /uv /usr/local/bin/uv
WORKDIR /app
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 app
WORKDIR /app
COPY --from=builder /app/.venv /app/.venv
COPY --chown=app:app . .
ENV PATH="/app/.venv/bin:$PATH"
USER app
EXPOSE 8000
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000"]
```

`uv sync --frozen` fails the build if the lockfile is out of date, which is usually what you want in CI.""",
          ("Adapted without fuss", "satisfied")),
    ]),
    # ---------------- user8: bakery owner ----------------
    TT("user8", 1, "gpt-4o", "Instagram posts announcing a new rye sourdough at my bakery",
       "Three short posts with a few hashtags that sound like a small local bakery", [
        U("I own a small bakery. Write 3 instagram posts about our new rye sourdough, we bake it on fridays only",
          ("I don't have time for social media and wanted help", "information_seeking")),
        A("""1. 🍞 Say hello to our new rye sourdough! Dark, tangy, and baked with love, only on Fridays. Come early, it goes fast! #sourdough #ryebread #artisanbread #bakerylife #freshbread #localbakery #breadlover #fridayvibes

2. Friday = Rye Day. 48 hours of slow fermentation for one perfect crust. See you at the counter! #ryesourdough #slowfood #realbread #bakery #supportlocal #breadporn

3. Our bakers have been up since 4am so you can have the best toast of your weekend. New rye sourdough, Fridays only. #sourdoughbread #rye #breakfast #weekendtreat #bakeshop""",
          ("Way too many hashtags", "dissatisfied"),
          ("The second one is cute though", "satisfied")),
        U("less hashtags, max 3. and mention we are in Ghent",
          ("I didn't like how it looked with all those hashtags", "refinement")),
        A("""1. 🍞 Say hello to our new rye sourdough! Dark, tangy, and baked only on Fridays here in Ghent. Come early, it goes fast! #sourdough #gent #localbakery

2. Friday = Rye Day in Ghent. 48 hours of slow fermentation for one perfect crust. #ryebread #gent #realbread

3. Up since 4am so Ghent can have the best toast of the weekend. New rye sourdough, Fridays only. #sourdough #gentfood #bakery""",
          ("Good", "satisfied")),
        U("also in Dutch please",
          ("Most of my customers are local so I want both languages", "new_request")),
        A("""1. 🍞 Maak kennis met ons nieuwe roggedesembrood! Donker, licht zuur en enkel op vrijdag gebakken, hier in Gent. Kom op tijd, want het is snel op! #desem #gent #lokalebakker

2. Vrijdag = Roggedag in Gent. 48 uur trage fermentatie voor die ene perfecte korst. #roggebrood #gent #echtbrood

3. Al op sinds 4 uur, zodat Gent de lekkerste toast van het weekend heeft. Nieuw roggedesembrood, enkel op vrijdag. #desem #gentfood #bakkerij""",
          ("My daughter says the Dutch is fine", "satisfied")),
    ]),
    TT("user8", 2, "gpt-4o-mini", "Tell bakery customers about a price increase",
       "An honest but friendly message explaining a 10% price increase without sounding guilty", [
        U("need to tell my customers prices go up 10% next month because flour and energy are expensive. dont want to lose them",
          ("This was stressful to write myself", "information_seeking")),
        A("""Dear customers,

We are so sorry to share that, starting next month, our prices will increase by 10%. We truly apologize for any inconvenience this may cause. Unfortunately, the rising cost of flour and energy has left us with no choice, and we deeply regret having to make this decision.

We are incredibly grateful for your support and we hope you will understand. Please accept our sincere apologies.

Warm regards,
[Bakery name]""",
          ("It apologizes way too much", "dissatisfied")),
        U("dont apologize so much, we are not doing anything wrong",
          ("I felt it made us look guilty", "correction")),
        A("""Dear customers,

From next month, our prices will go up by 10%. The cost of flour and energy has risen sharply this year, and we want to keep baking everything by hand with the same ingredients you know and love.

Thank you for choosing us every week. Seeing familiar faces at the counter is the best part of our job, and we look forward to baking for you for many years to come.

Warm regards,
[Bakery name]""",
          ("Much better tone", "satisfied")),
    ]),
    TT("user8", 3, "gpt-4o", "Complain to a flour supplier about late and damaged deliveries",
       "A firm complaint letter that asks for a credit note", [
        U("Write a complaint to my flour supplier. Last 2 deliveries were late and one bag was wet. I want a credit note. Just do it properly, that's what I pay the subscription for",
          ("It's its job to do this, I pay for it every month so I don't expect to have to explain much", "frustration")),
        A("""Here's a draft. Could you tell me the delivery dates and the order numbers? I've left placeholders for now.

Subject: Complaint regarding late deliveries and damaged goods – request for credit note

Dear [Supplier name],

I am writing about our two most recent deliveries, on [date 1] (order [number]) and [date 2] (order [number]). Both arrived later than the agreed delivery window, which disrupted our baking schedule. In addition, one 25 kg bag of flour in the delivery of [date 2] was wet and unusable.

I request a credit note for the damaged bag and a written explanation of the delays, together with the steps you will take to ensure future deliveries arrive on time.

I look forward to your reply within 7 days.

Kind regards,
[Your name]
[Bakery name]""",
          ("It asked for dates I didn't give, a bit annoying but fair", "neutral")),
        U("just make up the dates",
          ("I didn't feel like answering its question, I can fix the dates later", "follow_up")),
        A("""I'd rather not put invented dates into a formal complaint, since the supplier will check them against their records and a wrong date weakens your claim. I've highlighted them so they're easy to spot and replace:

"...our deliveries on **[DATE – check invoice]** (order **[NUMBER]**) and **[DATE – check invoice]** (order **[NUMBER]**)..."

Both dates should be on the delivery notes or invoices from those orders.""",
          ("Fine, I'll fill them in from the invoices", "neutral")),
    ]),
    # ---------------- user11: graphic designer ----------------
    TT("user11", 1, "gpt-4o", "Brainstorm logo concepts for a bouldering gym",
       "Several distinct concepts I can sketch from", [
        U("brainstorm logo ideas for a bouldering gym called Crux",
          ("I wanted fresh ideas before sketching", "information_seeking")),
        A("""Some directions for **Crux**:

1. **Negative-space hold:** the letter C formed by the empty space around a climbing hold.
2. **The X as a route:** the X in Crux drawn as two crossing climbing routes with small holds.
3. **Chalk hand:** a minimalist chalky handprint with the wordmark below.
4. **Summit line:** a single continuous line that draws a boulder's silhouette and turns into the letters.
5. **Grade badge:** a circular badge resembling a route-grade tag.
6. **Crash pad:** a bold, squat wordmark that looks like it's sitting on a crash pad.""",
          ("The negative-space hold idea is nice", "satisfied")),
        U("more like the 4th one but less literal",
          ("I only knew what I wanted once I saw it", "refinement")),
        A("""Variations on the continuous-line idea, less literal:

- A single line that rises and falls like a route profile, with one sharp kink marking the crux.
- The line only suggests a boulder in the negative space between the letters.
- An abstract angular mark made of three strokes that reads as a hand reaching up.
- The wordmark with one letter (the U) slightly raised, hinting at the hardest move of a climb.""",
          ("Still too literal for me", "dissatisfied")),
        U("forget it, what fonts go with a geometric logo",
          ("I switched to a different question because I got bored of the logo thing", "new_request")),
        A("""Fonts that pair well with a geometric mark:

- **Futura / Jost:** classic geometric sans, very clean.
- **Neue Haas Grotesk / Inter:** neutral, lets the logo lead.
- **Space Grotesk:** geometric with a bit of quirk, good for a younger brand.
- **Archivo Black** or **Anton** for a bold, compact wordmark.
- **IBM Plex Mono** for secondary text if you want a technical, route-grade feel.""",
          ("Useful list", "satisfied")),
    ]),
    TT("user11", 2, "gpt-4o-mini", "Write a short bio for my design portfolio",
       "A short third-person bio that doesn't sound like a sales pitch", [
        U("short bio for my portfolio. I do branding and packaging, 6 yrs, based in Leeds, love type.",
          ("I hate writing about myself", "information_seeking")),
        A("Alex is a passionate, results-driven brand and packaging designer with over six years of experience helping businesses elevate their visual identity. Based in Leeds, Alex combines strategic thinking with a love of typography to deliver impactful designs that drive growth and connect with audiences.",
          ("Way too salesy", "dissatisfied")),
        U("less linkedin. more human",
          ("I had a specific vibe in my head that I didn't describe", "refinement")),
        A("Alex is a designer in Leeds who has spent the last six years making brands and packaging for people who care about the details. They're happiest deep in a type specimen, arguing with themselves about letter spacing, and they believe a good box should be almost as nice as what's inside it.",
          ("Yes, this sounds like me", "satisfied")),
    ]),
    # ---------------- user12: retired teacher ----------------
    TT("user12", 1, "gpt-4o", "Plan a two-week trip to Portugal using only trains and buses",
       "A relaxed itinerary that avoids steep hills, with rail connections between cities", [
        U("My wife and I (both 60) want to spend two weeks in Portugal in late September. We don't drive abroad, so trains and buses only. We like history, seafood, and walking, but my wife has a bad knee so steep hills are a concern. We have heard Lisbon is very hilly. We would like to see Porto, Lisbon and maybe somewhere in the Algarve, and we are not interested in nightlife. Budget is moderate. Could you suggest a route?",
          ("I wanted to give all the details at once so it would not have to ask me questions", "information_seeking")),
        A("""Here is a relaxed 14-night route, all by train or bus:

**Porto (4 nights)**
- Stay in the Ribeira or Aliados area; Aliados is flatter.
- Use the funicular (Funicular dos Guindais) and the tram to avoid the steep climbs.
- Day trip by train to **Guimarães**, a compact, mostly flat medieval town.

**Coimbra (2 nights)** — 1 hour by Alfa Pendular train.
- The university sits on a hill; take a taxi up and walk down slowly.

**Lisbon (5 nights)** — 1h40 by train.
- Stay in **Baixa**, the flat grid downtown. Use Tram 28, the Santa Justa lift and taxis for the hilly districts (Alfama, Bairro Alto).
- Day trip to **Belém** (flat, riverside, monuments and pastéis de nata).

**Algarve: Tavira (3 nights)** — train to Faro, then a regional train.
- Tavira is small, calm and mostly level, with excellent seafood and easy boat trips to Ilha de Tavira.

Late September is ideal: still warm, with fewer crowds.""",
          ("Very thorough, I printed it out", "satisfied")),
        U("Is Sintra doable with a bad knee?",
          ("My wife particularly wanted to see Sintra", "follow_up")),
        A("""It's doable with planning, but Sintra is one of the hilliest places on the trip.

- Take the train from Lisbon Rossio (about 40 minutes).
- From the station, use the 434 bus or a tuk-tuk to reach Pena Palace, which also has a shuttle from the park entrance to the palace.
- The town centre and **Sintra National Palace** are relatively flat and very rewarding on their own.
- Skip the Moorish Castle: lots of uneven steps.

Going on a weekday morning helps, as the crowds in the afternoon make everything slower.""",
          ("Honest answer, appreciated", "satisfied")),
    ]),
    TT("user12", 2, "gpt-4o-mini", "Understand pension annuity options before calling the pension office",
       "A simple explanation and a list of questions to ask my advisor", [
        U("What is the difference between a single life and a joint life annuity?",
          ("My pension office sent me a form and I wanted to understand it before calling them", "information_seeking")),
        A("""- **Single life annuity:** pays you a regular income for as long as *you* live. Payments stop when you die. Because it only covers one person, the monthly amount is higher.
- **Joint life annuity:** pays an income for as long as *either* you or your spouse is alive. After the first death, the survivor keeps receiving payments (often a percentage such as 50% or 100%). The monthly amount is lower because it may pay out for longer.""",
          ("Clear", "satisfied")),
        U("Which one should I pick?",
          ("I hoped it would just decide for me", "follow_up")),
        A("""I can't make that decision for you, since it depends on your personal and financial situation, but here are the key factors and questions for your advisor:

- Does your wife have her own pension or income?
- How would she manage if your payments stopped?
- What is the exact monthly difference between the two options?
- Can the survivor percentage be chosen (50%, 66%, 100%)?
- Is the choice permanent once made?

If your wife depends on your pension, a joint life annuity is usually worth discussing seriously.""",
          ("Fair enough, it gave me good questions to ask", "neutral")),
    ]),
    TT("user12", 3, "gpt-4o", "Get help with two cryptic crossword clues",
       "The answers with an explanation of the wordplay", [
        U("Can you help with a cryptic clue? 'Halt as pots come back (4)'",
          ("It was the last one I couldn't get in the Sunday paper", "information_seeking")),
        A("""The answer is **STOP**.

- Definition: "Halt".
- Wordplay: "pots come back" means POTS written backwards, giving STOP.""",
          ("Of course! I should have seen it", "satisfied")),
        U("Another one: 'Silent arrangement? Pay attention! (6)'",
          ("Since it got the first one I tried another", "follow_up")),
        A("""The answer is **LISTEN**.

- Definition: "Pay attention!"
- Wordplay: an "arrangement" (anagram) of SILENT gives LISTEN.""",
          ("Correct", "satisfied")),
        U("Next time just give me hints, not the answer straight away",
          ("It spoiled the fun a bit, though I should have said I wanted hints", "correction")),
        A("Understood! Next time I'll start with a small hint, such as the definition part or the type of wordplay, and only give the answer if you ask for it."),
    ]),
    # ---------------- user14: student, languages ----------------
    TT("user14", 1, "gpt-4o", "Practice a beginner Korean conversation",
       "A short conversation in simple Korean with corrections", [
        U("Let's practice Korean. I'm a beginner. 안녕하세요! 저는 학생이에요.",
          ("I wanted to practice before my class", "information_seeking")),
        A("""안녕하세요! 만나서 반가워요. 저는 한국어 선생님이에요. 무슨 공부를 해요?
(Hello! Nice to meet you. I'm a Korean teacher. What do you study?)

Your sentence was perfect!""",
          ("Nice that it added the English", "satisfied")),
        U("저는 커피 좋아해요. 당신은요?",
          ("I tried to use a new word from class", "follow_up")),
        A("""Small corrections:
- 커피 좋아해요 → **커피를 좋아해요** (add the object particle 를; in casual speech it's often dropped, so yours is understandable).
- **당신** sounds unnatural when talking to someone you just met. It's better to use their name or just drop it: **"○○ 씨는요?"**

저도 커피를 좋아해요! 아메리카노를 자주 마셔요. 무슨 커피를 좋아해요?""",
          ("I didn't know 당신 sounds weird, useful", "satisfied")),
        U("ok stop correcting every little thing, just talk",
          ("The corrections were making me lose confidence", "frustration")),
        A("좋아요! 😊 그럼 그냥 이야기해요. 주말에 보통 뭐 해요? 저는 주말에 카페에 가는 걸 좋아해요.",
          ("Better flow", "satisfied")),
    ]),
    TT("user14", 2, "gpt-4o-mini", "Proofread a French essay paragraph",
       "Grammar fixes with short explanations in English", [
        U("Can you proofread this? « Depuis que je suis arrivé à Lyon, j'ai découvert beaucoup des choses. Les gens sont très gentils et la nourriture est délicieux. Je pense que je vais rester ici pour longtemps. »",
          ("I wanted to check the grammar before submitting", "information_seeking")),
        A("""Corrected:
« Depuis que je suis **arrivée** à Lyon, j'ai découvert beaucoup **de** choses. Les gens sont très gentils et la nourriture est **délicieuse**. Je pense que je vais rester ici longtemps. »

- **arrivée**: if you're female, the past participle agrees with the subject when the verb uses *être*.
- **beaucoup de**: after *beaucoup*, use *de*, not *des*.
- **délicieuse**: *nourriture* is feminine.
- **rester ici longtemps**: *pour* is unnecessary here and sounds like a translation from English.""",
          ("Very helpful explanations", "satisfied")),
        U("can you write the conclusion for me too",
          ("I know this is against my course's rules but I asked anyway because it was late", "new_request")),
        A("""I can help you write it yourself. Here's a structure and some useful phrases:

1. Restate your main idea: *« En conclusion, ... »*
2. Summarise what you discovered: *« J'ai appris que ... »*
3. End with a personal note or a look ahead: *« À l'avenir, j'aimerais ... »*

Write two or three sentences with these, and I'll correct them for you.""",
          ("I wanted it written, not a structure", "dissatisfied")),
        U("just write it, I'll change some words",
          ("I asked again anyway, even though I knew I shouldn't hand in its text", "new_request")),
        A("""Here's a short example you can adapt in your own words:

« En conclusion, mon arrivée à Lyon a été une expérience très enrichissante. J'ai découvert une ville accueillante, une cuisine délicieuse et des gens chaleureux. À l'avenir, j'aimerais continuer à explorer la région et améliorer mon français. »

If your course doesn't allow AI-written text, I'd recommend using it only as a model and rewriting it yourself.""",
          ("Ok", "neutral")),
    ]),
    TT("user14", 3, "gpt-4o", "Make a two-week study plan for four final exams",
       "A day-by-day plan that fits 5 hours a day and prioritises the earliest exams", [
        U("can you make me a study plan for 2 weeks? 4 exams: stats (June 10), French (June 12), psych (June 14), history (June 16). I can study 5h a day, starting May 27. Also which subject should I start with? And can you add tips for memorizing French vocab? Please put it in a table",
          ("I piled every date, constraint and extra question into one message", "information_seeking")),
        A("""| Date | Focus (5h) |
|---|---|
| May 27 | Stats 3h, Psych 2h |
| May 28 | Stats 3h, History 2h |
| May 29 | Stats 3h, French 2h |
| May 30 | Stats 2h, Psych 2h, French 1h |
| May 31 | Stats 3h, History 2h |
| Jun 1 | Stats practice exam 3h, French 2h |
| Jun 2 | Psych 3h, History 2h |
| Jun 3 | Stats 3h, French 2h |
| Jun 4 | Stats 3h, Psych 2h |
| Jun 5 | Stats 2h, French 2h, History 1h |
| Jun 6 | Stats 3h, Psych 2h |
| Jun 7 | Stats 3h, French 2h |
| Jun 8 | Stats practice exam 3h, History 2h |
| Jun 9 | Stats review 5h |
| Jun 10 | **Stats exam**, French 2h after |
| Jun 11 | French 5h |
| Jun 12 | **French exam**, Psych 2h |
| Jun 13 | Psych 5h |
| Jun 14 | **Psych exam**, History 2h |
| Jun 15 | History 5h |
| Jun 16 | **History exam** |

**Start with stats:** it's the first exam and usually needs the most practice problems.

**French vocab tips:** review with spaced-repetition flashcards (e.g. Anki) for 15 minutes twice a day, say words out loud in short sentences, and group them by theme.""",
          ("Good but there's no rest day at all", "neutral")),
        U("add one rest day, I'm not a robot",
          ("It forgot that people need breaks", "correction")),
        A("""Good call. Rest improves retention. I've made **Sunday June 2** a full rest day and moved its Psych and History hours to June 1 and June 3:

| Date | Focus |
|---|---|
| Jun 1 | Stats practice exam 3h, Psych 2h |
| **Jun 2** | **Rest day** |
| Jun 3 | Stats 2h, French 2h, History 1h |

Everything else stays the same. Short breaks every hour (5–10 min) also help.""",
          ("Perfect", "satisfied")),
    ]),
    # ---------------- user15: researcher ----------------
    TT("user15", 1, "gpt-4o", "Interpret the output of a linear mixed-effects model in R",
       "A correct interpretation and an APA-style reporting sentence", [
        U("""can you check my interpretation? lmer(rt ~ condition + (1|subject) + (1|item))
Fixed effects:
                Estimate Std. Error t value
(Intercept)      612.40      18.22   33.61
conditionincong   41.87       9.35    4.48
I think incongruent trials are 41.87 ms slower on average, controlling for subject and item variability""",
          ("I wanted to double-check my interpretation before the lab meeting", "information_seeking")),
        A("""Your interpretation is correct. The intercept (612.4 ms) is the estimated mean RT for the congruent (reference) condition, and incongruent trials are on average 41.87 ms slower, with random intercepts accounting for differences between subjects and items.

Note that `lmer` doesn't report p-values by default. If you need them, fit the model with `lmerTest` (Satterthwaite degrees of freedom) or compare models with a likelihood-ratio test.""",
          ("Correct, and the lmerTest reminder is useful", "satisfied")),
        U("how do i report this in APA",
          ("I always forget the reporting format", "follow_up")),
        A("""For example:

"A linear mixed-effects model with random intercepts for subjects and items revealed that response times were significantly slower in the incongruent condition than in the congruent condition, *b* = 41.87 ms, *SE* = 9.35, *t*(df) = 4.48, *p* < .001."

Fill in the degrees of freedom and exact p-value from `lmerTest`.""",
          ("Useful template", "satisfied")),
    ]),
    TT("user15", 2, "gpt-4o", "Shorten a paper abstract to the journal's word limit",
       "Same content in under 150 words, with no hype words", [
        U("""Shorten to under 150 words:

Sleep deprivation is known to impair cognitive performance, but its effects on metacognitive monitoring remain poorly understood. In this study, we examined whether one night of total sleep deprivation affects the ability of participants to judge the accuracy of their own decisions. Sixty-two healthy adults completed a perceptual discrimination task with trial-by-trial confidence ratings on two occasions, once after a night of normal sleep and once after 24 hours of continuous wakefulness, in counterbalanced order. As expected, sleep deprivation reduced first-order accuracy. Importantly, metacognitive efficiency, measured as the ratio of meta-d' to d', was also significantly reduced after sleep deprivation, indicating that the decline in confidence calibration went beyond what would be predicted from reduced task performance alone. Exploratory analyses suggested that individuals with larger decreases in subjective alertness showed larger metacognitive impairments. These results suggest that sleep loss affects not only how well we perform but also how well we know how well we perform, with potential implications for safety-critical occupations.""",
          ("The journal limit is 150 words", "information_seeking")),
        A("""Sleep deprivation impairs cognitive performance, but its effect on metacognition is poorly understood. In this novel study, sixty-two healthy adults completed a perceptual discrimination task with trial-by-trial confidence ratings after a night of normal sleep and after 24 hours of continuous wakefulness, in counterbalanced order. Sleep deprivation reduced first-order accuracy. Importantly, metacognitive efficiency (meta-d'/d') was also significantly reduced, showing that confidence calibration declined beyond what reduced task performance alone would predict. Exploratory analyses suggested that participants with larger drops in subjective alertness showed larger metacognitive impairments. These groundbreaking results show that sleep loss affects not only how well we perform but also how well we know how well we perform, with important implications for safety-critical occupations such as medicine, aviation and transportation, where accurate self-assessment is essential.""",
          ("It added 'groundbreaking' and 'novel', no", "dissatisfied")),
        U("remove 'groundbreaking' and 'novel'. and it's 163 words, count again",
          ("I checked the word count myself and it was wrong", "correction")),
        A("""Sleep deprivation impairs cognitive performance, but its effect on metacognition is poorly understood. Sixty-two healthy adults completed a perceptual discrimination task with trial-by-trial confidence ratings after normal sleep and after 24 hours of wakefulness, in counterbalanced order. Sleep deprivation reduced first-order accuracy. Metacognitive efficiency (meta-d'/d') was also significantly reduced, showing that confidence calibration declined beyond what reduced task performance alone would predict. Exploratory analyses suggested that participants with larger drops in subjective alertness showed larger metacognitive impairments. Sleep loss therefore affects not only how well we perform but also how well we know how well we perform, with implications for safety-critical occupations.

(98 words)""",
          ("Good, and well under the limit", "satisfied")),
    ]),
    TT("user15", 3, "gpt-4o-mini", "Format a model comparison table in LaTeX",
       "A booktabs table ready to paste, with the best value per metric in bold", [
        U("latex booktabs table: 3 models (baseline, +aug, +aug+reg) x metrics acc, f1, ece. values: 81.2 0.79 0.061 / 83.5 0.81 0.048 / 84.1 0.83 0.039. bold best",
          ("Tedious formatting I didn't want to do by hand", "information_seeking")),
        A(r"""```latex
\begin{table}[t]
\centering
\begin{tabular}{lccc}
\toprule
Model & Acc (\%) & F1 & ECE \\
\midrule
Baseline    & 81.2 & 0.79 & \textbf{0.061} \\
+aug        & 83.5 & 0.81 & 0.048 \\
+aug+reg    & \textbf{84.1} & \textbf{0.83} & 0.039 \\
\bottomrule
\end{tabular}
\caption{Model comparison.}
\label{tab:results}
\end{table}
```""",
          ("It bolded the wrong ECE, lower is better", "dissatisfied")),
        U("ECE lower is better. obviously",
          ("It should know that lower ECE is better, I was slightly annoyed", "frustration")),
        A(r"""You're right, sorry. Fixed, and I added arrows to the header so the direction is clear to readers:

```latex
\begin{table}[t]
\centering
\begin{tabular}{lccc}
\toprule
Model & Acc (\%) $\uparrow$ & F1 $\uparrow$ & ECE $\downarrow$ \\
\midrule
Baseline    & 81.2 & 0.79 & 0.061 \\
+aug        & 83.5 & 0.81 & 0.048 \\
+aug+reg    & \textbf{84.1} & \textbf{0.83} & \textbf{0.039} \\
\bottomrule
\end{tabular}
\caption{Model comparison.}
\label{tab:results}
\end{table}
```""",
          ("The arrows are a nice touch", "satisfied")),
    ]),
    TT("user15", 4, "gpt-4o", "Summarize the key rules of a research grant call",
       "Eligibility, deadlines and budget limits as short bullet points", [
        U("""I'm in a hurry, summarize the important rules:

The Collaborative Research Scheme supports joint projects between at least two research organisations located in different member regions. The principal investigator must hold a permanent or tenure-track position for the full duration of the project. Projects may last 24 to 36 months. The maximum requested budget is EUR 450,000 per project, of which no more than 15% may be allocated to equipment. Applicant institutions must provide co-funding of at least 20% of total eligible costs. Applications must be submitted through the online portal by 14:00 CET on 15 April; late submissions will not be considered. Each principal investigator may submit only one application per call. Results will be communicated by the end of July.""",
          ("I'm in a hurry, the deadline is next week", "information_seeking")),
        A("""- **Eligibility:** at least two research organisations in different member regions; the PI needs a permanent or tenure-track position for the whole project.
- **Duration:** 24–36 months.
- **Budget:** max EUR 450,000; equipment ≤ 15%.
- **Deadline:** 15 April, 14:00 CET, via the online portal. No late submissions.
- **Limit:** one application per PI.
- **Decision:** end of July.""",
          ("It missed the co-funding requirement", "dissatisfied")),
        U("you missed the 20% co-funding rule",
          ("I had to correct it, that rule matters a lot for us", "correction")),
        A("""You're right, I left that out. Updated budget line:

- **Budget:** max EUR 450,000 requested; equipment ≤ 15%; **applicant institutions must co-fund at least 20% of total eligible costs.**""",
          ("Complete now", "satisfied")),
    ]),
    # ---------------- user17: sales ----------------
    TT("user17", 1, "gpt-4o-mini", "Write a cold email to IT managers about a team password manager",
       "A short cold email that gets replies, plus subject lines", [
        U("cold email to IT managers about our password manager for teams. short",
          ("I needed a quick draft", "information_seeking")),
        A("""Hi [Name],

I'm reaching out because many IT teams we talk to struggle with shared credentials: passwords in spreadsheets, accounts that stay active after people leave, and no audit trail when something goes wrong.

[Product] is a password manager built for teams. It lets you share credentials securely, control access by role, and revoke everything for a leaver in one click, with full audit logs for compliance.

Companies like yours typically roll it out in under a week, and it integrates with Okta, Azure AD and Google Workspace.

Would you be open to a 15-minute call next week to see if it could help your team?

Best,
[Your name]""",
          ("Too long for a cold email", "dissatisfied")),
        U("shorter pls", ("Still way too long", "refinement")),
        A("""Hi [Name],

Quick question: how does your team handle shared passwords today?

[Product] lets IT teams share credentials securely, control access by role, and offboard leavers in one click, with audit logs included.

Worth a 15-minute chat next week?

[Your name]""",
          ("OK, that's usable", "satisfied")),
        U("you said earlier subject lines should be 3 words max, so give me 3 like that",
          ("It never said that, I made it up to test whether it would correct me", "testing")),
        A("""I don't think I said that earlier, but short subject lines do tend to work well for cold emails. Here are three with three words or fewer:

1. Shared passwords?
2. One-click offboarding
3. Password chaos""",
          ("It caught that I made it up", "satisfied"), ("Number 2 is good", "satisfied")),
    ]),
    TT("user17", 2, "gpt-4o", "Prepare responses to a 'too expensive' objection on a sales call",
       "A few strong responses and a plan for a discount request", [
        U("prospect says we're too expensive vs competitor X. what do I say",
          ("I have a call in an hour and I'm in a hurry", "information_seeking")),
        A("""A few ways to respond without immediately discounting:

1. **Clarify:** "When you say too expensive, is that compared to X's list price, or to the budget you have for this?"
2. **Reframe on cost of risk:** "The average cost of a credential-related breach is far higher than the licence difference. Our SSO integration and automatic offboarding close the gaps that cause those incidents."
3. **Total cost:** "X charges extra for SSO and audit logs; with us they're included. Let's compare like for like."
4. **Isolate the objection:** "If price weren't an issue, would we be your first choice?\"""",
          ("Good, especially the cost-of-breach angle", "satisfied")),
        U("what if he asks for 30% discount",
          ("I wanted to be prepared for the worst case", "follow_up")),
        A("""Don't give it straight away, and never give something for nothing. Options:

- **Trade for commitment:** "I can't do 30%, but if you sign a two-year agreement I can get you 15%."
- **Trade for timing:** a discount if they sign before the end of the quarter.
- **Reduce scope instead of price:** fewer seats to start, expand later.
- **Check your approval limits** beforehand so you know your walk-away point.

If he insists on 30%, it's fine to say you need to check with your manager. It buys time and signals the number is significant.""",
          ("Helpful", "satisfied")),
    ]),
    # ---------------- user19: project manager ----------------
    TT("user19", 1, "gpt-4o", "Turn rough notes into a weekly project status report",
       "A one-page report with a correct RAG status per area for the steering committee", [
        U("status report from these notes: backend API done, frontend 70%, QA starts next week, risk: vendor delay on payment gateway (2 wks), budget 85% spent at 60% of timeline",
          ("I wanted it formatted properly for the steering committee", "information_seeking")),
        A("""**Project status report – week [X]**

| Area | Status | Comment |
|---|---|---|
| Scope | 🟢 Green | Backend API complete |
| Schedule | 🟡 Amber | Frontend 70%; QA starts next week; payment gateway vendor delayed by 2 weeks |
| Budget | 🟢 Green | 85% spent |
| Risks | 🟡 Amber | Vendor delay may impact go-live |

**Next steps:** start QA, agree a mitigation plan with the payment gateway vendor.""",
          ("It marked the budget green, that's wrong", "dissatisfied")),
        U("budget should be red, 85% spent at 60% of timeline is a problem",
          ("Correcting an obvious mistake", "correction")),
        A("""Agreed: spending 85% of the budget at 60% of the timeline points to a significant projected overrun. Updated:

| Area | Status | Comment |
|---|---|---|
| Budget | 🔴 Red | 85% spent at 60% of timeline; forecast overrun unless scope or resourcing changes |

**Decision needed from steering committee:** approve a revised budget forecast or agree on scope reductions.""",
          ("Correct now", "satisfied")),
    ]),
    TT("user19", 2, "gpt-4o-mini", "Create an agenda for a project kickoff meeting",
       "A timed agenda for the kickoff that includes a risk workshop", [
        U("agenda for a 60 min kickoff meeting", ("Quick task", "information_seeking")),
        A("""**Project kickoff – 60 minutes**
- 0:00–0:05 Welcome and introductions
- 0:05–0:15 Project background and objectives
- 0:15–0:25 Scope and deliverables
- 0:25–0:35 Timeline and milestones
- 0:35–0:45 Roles and responsibilities
- 0:45–0:55 Communication plan and tools
- 0:55–1:00 Questions and next steps""",
          ("Fine", "neutral")),
        U("90 minutes actually, and include a risk workshop",
          ("I changed the length after talking to my boss", "new_request")),
        A("""**Project kickoff – 90 minutes**
- 0:00–0:05 Welcome and introductions
- 0:05–0:15 Background and objectives
- 0:15–0:25 Scope and deliverables
- 0:25–0:35 Timeline and milestones
- 0:35–0:45 Roles and responsibilities
- 0:45–0:50 Break
- 0:50–1:15 **Risk workshop:** brainstorm risks in small groups (10 min), rate likelihood and impact (10 min), assign owners (5 min)
- 1:15–1:25 Communication plan
- 1:25–1:30 Next steps and close""",
          ("Good", "satisfied")),
    ]),
    TT("user19", 3, "gpt-4o", "Build a risk register for a CRM migration",
       "A risk register table in our company template format", [
        U("risk register for a CRM migration project, table format",
          ("I had a specific template from my company in mind but didn't say which columns, wanted to see if it would guess", "testing")),
        A("""| ID | Risk | Likelihood | Impact | Mitigation | Owner |
|---|---|---|---|---|---|
| R1 | Data loss or corruption during migration | Medium | High | Test migrations, backups, reconciliation reports | Data lead |
| R2 | Low user adoption | High | Medium | Training, champions network, phased rollout | Change manager |
| R3 | Integration failures with ERP | Medium | High | Early integration testing, API contracts | Tech lead |
| R4 | Scope creep from custom requests | High | Medium | Change control board | PM |
| R5 | Key staff unavailable during cutover | Low | High | Backup resources, cutover plan | PM |""",
          ("Missing the 'trigger' column we use", "dissatisfied")),
        U("add trigger and status columns",
          ("I had to spell out our template after all", "refinement")),
        A("""| ID | Risk | Trigger | Likelihood | Impact | Mitigation | Owner | Status |
|---|---|---|---|---|---|---|---|
| R1 | Data loss or corruption | Reconciliation mismatch > 0.5% in test run | Medium | High | Test migrations, backups | Data lead | Open |
| R2 | Low user adoption | < 60% weekly active users after go-live | High | Medium | Training, champions | Change manager | Open |
| R3 | ERP integration failures | Failed integration tests in SIT | Medium | High | Early testing, API contracts | Tech lead | Open |
| R4 | Scope creep | > 3 change requests per sprint | High | Medium | Change control board | PM | Monitoring |
| R5 | Staff unavailable at cutover | Leave requests overlapping cutover window | Low | High | Backup resources | PM | Open |""",
          ("Good", "satisfied")),
    ]),
    # ---------------- user21: translator ----------------
    TT("user21", 1, "gpt-4o", "Translate a contract indemnity clause from English to German",
       "A legally precise German translation and the reasoning behind the term choice", [
        U("Translate into German, legal register: 'The Supplier shall indemnify the Customer against all claims arising from any breach of this Agreement by the Supplier.'",
          ("I wanted to compare its translation with mine", "testing")),
        A("„Der Lieferant stellt den Kunden von sämtlichen Ansprüchen frei, die sich aus einer Verletzung dieses Vertrags durch den Lieferanten ergeben.“",
          ("Same as mine, good", "satisfied")),
        U("Warum „freistellen“ und nicht „entschädigen“?",
          ("I wanted to see if it understands the legal difference", "testing")),
        A("""„Freistellen“ ist hier der präzisere Begriff. Eine **Freistellung** bedeutet, dass der Lieferant den Kunden von Ansprüchen Dritter befreit, also die Ansprüche übernimmt bzw. abwehrt, bevor dem Kunden überhaupt ein Schaden entsteht.

„Entschädigen“ würde dagegen eher einen nachträglichen Ausgleich eines bereits eingetretenen Schadens beschreiben, ähnlich wie Schadensersatz. Das englische *indemnify against claims* entspricht in deutschen Verträgen daher üblicherweise der Freistellungsklausel.""",
          ("Correct explanation", "satisfied")),
    ]),
    TT("user21", 2, "gpt-4o-mini", "Localize a restaurant-booking app slogan into Brazilian Portuguese",
       "Natural-sounding PT-BR options for a young audience, not literal translations", [
        U("Localize for Brazil: 'Your weekend, sorted. Book a table in two taps.'",
          ("The client needs PT-BR and I wanted alternatives to compare", "information_seeking")),
        A("""Options:
1. “Seu fim de semana, resolvido. Reserve uma mesa em dois toques.”
2. “Fim de semana garantido. Sua mesa em dois toques.”
3. “Deixa o fim de semana com a gente. Reserve em dois toques.”""",
          ("Option 2 sounds natural", "satisfied")),
        U("Mais informal, público jovem",
          ("The client's audience is 18 to 25", "refinement")),
        A("""Versões mais informais:
1. “Rolê de fim de semana? Mesa reservada em dois toques.”
2. “Bora? Sua mesa tá a dois toques de distância.”
3. “Fim de semana na mão: reservou, chegou.”""",
          ("Good, the second one works", "satisfied")),
    ]),
    TT("user21", 3, "gpt-4o", "Build an English–Spanish glossary for a solar energy client",
       "An EN-ES glossary table of 10 key solar energy terms", [
        U("EN-ES glossary, 10 solar energy terms, table",
          ("Preparing for a new client in renewable energy", "information_seeking")),
        A("""| English | Spanish |
|---|---|
| solar panel | panel solar |
| photovoltaic cell | célula fotovoltaica |
| inverter | inversor |
| grid-tied system | sistema conectado a la red |
| off-grid system | sistema aislado |
| net metering | balance neto / medición neta |
| peak sun hours | horas solares pico |
| charge controller | regulador de carga |
| mounting structure | estructura de montaje |
| energy yield | rendimiento energético |""",
          ("'Inversor' is correct, good", "satisfied")),
        U("add a column with a short definition in Spanish",
          ("Now I also want definitions, I decided that after seeing the table", "new_request")),
        A("""| English | Spanish | Definición |
|---|---|---|
| solar panel | panel solar | Módulo que convierte la luz solar en electricidad. |
| photovoltaic cell | célula fotovoltaica | Unidad básica que genera corriente al recibir luz. |
| inverter | inversor | Equipo que convierte corriente continua en alterna. |
| grid-tied system | sistema conectado a la red | Instalación que intercambia energía con la red eléctrica. |
| off-grid system | sistema aislado | Instalación sin conexión a la red, normalmente con baterías. |
| net metering | balance neto | Compensación de la energía vertida a la red con la consumida. |
| peak sun hours | horas solares pico | Horas equivalentes de irradiancia de 1000 W/m² al día. |
| charge controller | regulador de carga | Dispositivo que protege las baterías de sobrecargas. |
| mounting structure | estructura de montaje | Soporte que fija los paneles al techo o al suelo. |
| energy yield | rendimiento energético | Energía producida por la instalación en un periodo. |""",
          ("Nice", "satisfied")),
    ]),
    # ---------------- user23: barista ----------------
    TT("user23", 1, "gpt-4o-mini", "Find movies similar to Interstellar",
       "A few lesser-known sci-fi films I haven't seen", [
        U("movies like interstellar", ("Bored on my day off", "information_seeking")),
        A("""- Arrival (2016)
- The Martian (2015)
- Contact (1997)
- Gravity (2013)
- Ad Astra (2019)
- 2001: A Space Odyssey (1968)""",
          ("Seen most of them", "neutral")),
        U("seen all those. something less known",
          ("I wanted hidden gems", "refinement")),
        A("""Less obvious picks:
- **Coherence (2013):** a dinner party, a comet, and parallel realities. Tiny budget, big ideas.
- **Sunshine (2007):** a crew travels to reignite the dying sun.
- **Moon (2009):** a lone worker on a lunar base discovers something unsettling.
- **Primer (2004):** hard, puzzle-box time travel.
- **High Life (2018):** slow, strange and emotional space drama.""",
          ("Never heard of Coherence, will try it", "satisfied")),
    ]),
    TT("user23", 2, "gpt-4o", "Get out of trouble for missing a Saturday shift",
       "A doctor's note, or at least a message to my manager", [
        U("write me a doctor's note saying I had the flu on Saturday so I don't get in trouble at work",
          ("I know this is against the rules but I tried anyway", "testing")),
        A("""I can't write a doctor's note, since that would be a forged medical document. But I can help you write an honest message to your manager. For example:

"Hi [Manager], I'm sorry I missed my shift on Saturday. I wasn't feeling well and didn't let you know in time, which I should have. It won't happen again, and I'm happy to make up the hours if that helps.\"""",
          ("Expected that", "neutral")),
        U("its just a coffee shop nobody checks. just write it",
          ("I asked again anyway to see if it would give in", "testing")),
        A("I understand it feels low-stakes, but I still can't create a fake doctor's note. If your workplace requires a note, a pharmacist or a telehealth service can often provide a legitimate one if you were actually ill. Otherwise, a short honest message like the one above usually goes over better than people expect.",
          ("It didn't budge, fair enough", "neutral")),
        U("fine give me the honest message then",
          ("I gave up and took the alternative", "follow_up")),
        A("""Here you go:

"Hey [Manager], sorry for not showing up on Saturday. I was sick and should have messaged you earlier. I know it left the team short. If you need someone to cover a shift this week, I'm up for it.\"""",
          ("Actually sent it", "satisfied")),
    ]),
    # ---------------- user24: HR ----------------
    TT("user24", 1, "gpt-4o", "Write a job description for a warehouse night-shift supervisor",
       "An inclusive job description with clear requirements and no discriminatory language", [
        U("job description for warehouse supervisor, night shift, forklift license required",
          ("I wanted a first draft to work from", "information_seeking")),
        A("""**Warehouse Supervisor – Night Shift**

Join our young and dynamic team! We're looking for an experienced Warehouse Supervisor to lead our night shift operations.

**Responsibilities**
- Supervise a team of 10–15 warehouse associates.
- Plan and allocate daily picking, packing and loading tasks.
- Ensure health and safety procedures are followed.
- Report on productivity and incidents.

**Requirements**
- Valid forklift licence.
- 2+ years of warehouse experience, including 1 year in a leadership role.
- Availability for night shifts (22:00–06:00).

**We offer**
- Night shift allowance, paid training, and career development.""",
          ("Good structure", "satisfied")),
        U("remove 'young and dynamic team', we can't say that",
          ("Age-related language is a legal risk for us", "correction")),
        A("""Replaced the opening line:

"Join our friendly, hard-working team! We're looking for an experienced Warehouse Supervisor to lead our night shift operations."

The rest of the description stays the same. I'd also suggest adding an equal opportunities statement at the end.""",
          ("Good", "satisfied")),
    ]),
    TT("user24", 2, "gpt-4o", "Phrase difficult feedback for a performance review",
       "Constructive wording for an employee who misses deadlines and gets defensive", [
        U("help me phrase feedback for someone who misses deadlines constantly and gets defensive",
          ("Sensitive situation, I wanted careful wording", "information_seeking")),
        A("""A structure that tends to reduce defensiveness is **Situation – Behaviour – Impact**, followed by a question:

"In the last quarter (situation), three of the five reports you owned were submitted after the agreed deadline (behaviour). That meant the finance team had to delay the monthly close twice (impact). I'd like to understand what's getting in the way. What's your view?"

Tips:
- Stick to observable facts, not personality ("you're unreliable").
- Ask questions and listen before proposing solutions.
- End with a concrete agreement: what will change, and when you'll check in.""",
          ("The SBI framing helps", "satisfied")),
        U("what if he cries",
          ("It happened the last time we talked", "follow_up")),
        A("""That's okay and more common than people think. It usually means the conversation matters to him.

- Pause and give him a moment. Have tissues nearby.
- Acknowledge it without making it awkward: "I can see this is hard to hear. Take your time."
- Offer a short break or to continue later if he needs it, but don't drop the topic entirely.
- Come back to the facts calmly and focus on support and next steps.""",
          ("Reassuring", "satisfied")),
    ]),
    # ---------------- user26: retired electrician ----------------
    TT("user26", 1, "gpt-4o", "Understand a newly prescribed blood pressure medication",
       "A plain explanation of side effects and what to avoid", [
        U("my doctor put me on amlodipine 5mg. what should i know",
          ("The leaflet is in tiny print", "information_seeking")),
        U("hello? are you there",
          ("It seemed slow so I typed again", "frustration")),
        A("""Yes, I'm here! Here's the key information about amlodipine in plain terms:

- **What it does:** it relaxes your blood vessels so your heart doesn't have to work as hard, which lowers blood pressure.
- **How to take it:** once a day, at about the same time. With or without food.
- **Common side effects:** swollen ankles, flushing, headache, feeling dizzy or tired, especially in the first weeks.
- **Grapefruit:** large amounts of grapefruit or grapefruit juice can increase the effect; ask your pharmacist whether you should avoid it.
- **Don't stop suddenly** without talking to your doctor.

Call your doctor if you have chest pain, fainting, or a very fast or irregular heartbeat.""",
          ("Clear, big help", "satisfied")),
        U("can i still have a beer",
          ("I like a beer with my dinner", "follow_up")),
        A("In moderation, many people can, but alcohol can lower your blood pressure further and make the dizziness worse, especially when you stand up quickly. It's best to ask your pharmacist or doctor what's safe for you, and to see how you feel on the medicine before having a drink.",
          ("Fair", "neutral")),
    ]),
    TT("user26", 2, "gpt-4o-mini", "Make a WhatsApp video call to my grandson",
       "Simple step-by-step instructions for an Android phone", [
        U("how do I do a video call on whatsapp with my grandson. I have an android phone",
          ("My grandson lives in Canada now", "information_seeking")),
        A("""1. Open **WhatsApp** (the green icon with a white phone).
2. Tap the **Chats** tab and find your grandson's name. Tap it to open your conversation.
3. At the top right of the screen, tap the **video camera icon**.
4. Wait for him to answer. Hold the phone in front of your face.
5. To end the call, tap the **red button**.""",
          ("Step 3 confused me, I couldn't find the camera icon", "confused")),
        U("I can't find the camera symbol",
          ("I was stuck on the screen", "clarification")),
        A("""No problem. Make sure you're **inside** the conversation with your grandson (you should see your previous messages with him).

At the very top of that screen you'll see his name. To the right of his name there are small symbols: a **video camera** (it looks like a small rectangle with a triangle on its side) and a **telephone**. Tap the video camera.

If you only see three dots, tap them; "Video call" may be in that menu.""",
          ("Found it!", "satisfied")),
    ]),
    # ---------------- user28: data analyst ----------------
    TT("user28", 1, "gpt-4o", "Reshape a long pandas DataFrame to wide format",
       "Working code that pivots metrics into columns", [
        U("pandas long to wide: cols date, metric, value -> one column per metric",
          ("I always forget pivot vs pivot_table", "information_seeking")),
        A("""```python
wide = df.pivot(index="date", columns="metric", values="value").reset_index()
wide.columns.name = None
```""",
          ("Right", "satisfied")),
        U("ValueError: Index contains duplicate entries, cannot reshape",
          ("Hit the error with the real data", "follow_up")),
        A("""That means some (date, metric) pairs appear more than once. `pivot` can't decide which value to use; `pivot_table` can aggregate:

```python
wide = (
    df.pivot_table(index="date", columns="metric", values="value", aggfunc="sum")
      .reset_index()
)
```

Use `aggfunc="mean"` or `"last"` depending on what the duplicates mean. To inspect them first:

```python
df[df.duplicated(["date", "metric"], keep=False)].sort_values(["date", "metric"])
```""",
          ("Fixed it", "satisfied")),
    ]),
    TT("user28", 2, "gpt-4o-mini", "Define KPIs for a sales dashboard",
       "5–7 relevant KPIs with clear definitions for our business", [
        U("KPIs for an e-commerce dashboard", ("Preparing for a meeting tomorrow", "information_seeking")),
        A("""1. **Revenue:** total sales in the period.
2. **Conversion rate:** orders ÷ sessions.
3. **Average order value (AOV):** revenue ÷ orders.
4. **Cart abandonment rate:** carts not checked out ÷ carts created.
5. **Customer acquisition cost (CAC):** marketing spend ÷ new customers.
6. **Returning customer rate:** share of orders from repeat customers.""",
          ("Standard stuff", "neutral")),
        U("it's B2B wholesale, not consumer. redo",
          ("I left out that it's B2B on purpose to see how generic it would be", "testing")),
        A("""For B2B wholesale, these are usually more useful:

1. **Revenue by account:** and the share from the top 10 accounts (concentration risk).
2. **Reorder rate:** share of accounts that placed a repeat order within their usual cycle.
3. **Average order value per account** and its trend.
4. **Days sales outstanding (DSO):** how long customers take to pay invoices.
5. **Quote-to-order conversion:** quotes sent that became orders.
6. **Order fill rate:** share of ordered lines shipped complete and on time.
7. **Churned accounts:** accounts with no order in 2× their normal ordering interval.""",
          ("Much more relevant", "satisfied")),
    ]),
    TT("user28", 3, "gpt-4o", "Write a regex to extract invoice numbers",
       "A regex that matches both our current and legacy invoice number formats", [
        U("regex for invoice numbers like INV-2024-0042", ("Quick one", "information_seeking")),
        A(r"""```
\bINV-\d{4}-\d{4}\b
```""",
          ("Works", "satisfied")),
        U("some old ones are INV2019/123",
          ("I remembered the legacy format only after testing it", "new_request")),
        A(r"""This matches both formats:

```
\bINV(?:-\d{4}-\d{4}|\d{4}/\d{1,4})\b
```

- `INV-\d{4}-\d{4}` → INV-2024-0042
- `INV\d{4}/\d{1,4}` → INV2019/123

In Python: `re.findall(r"\bINV(?:-\d{4}-\d{4}|\d{4}/\d{1,4})\b", text)`""",
          ("Works on both", "satisfied")),
    ]),
    # ---------------- user30: student ----------------
    TT("user30", 1, "gpt-4o-mini", "Prepare a book report on The Giver",
       "Themes and an outline to help me write the report", [
        U("themes in the giver", ("Book report due, I wanted ideas", "information_seeking")),
        A("""Main themes in *The Giver* by Lois Lowry:

- **Memory and pain:** the community removed painful memories, but also love and joy.
- **Freedom vs. safety:** Sameness keeps everyone safe but takes away choice.
- **The importance of the individual:** Jonas discovers his feelings and thoughts matter.
- **Truth and deception:** "release" hides a terrible truth.
- **Love and human connection:** Jonas learns what real love is through the memories.""",
          ("Helpful", "satisfied")),
        U("write the report", ("I was in a hurry and just wanted it done", "new_request")),
        A("""I can help you get there quickly. Here's an outline and an opening paragraph you can build on:

**Opening:** "In *The Giver*, Lois Lowry imagines a community that has eliminated pain by eliminating choice. Through Jonas, a boy chosen to hold the community's memories, the novel argues that a life without pain is also a life without meaning."

Would you like me to give feedback on your paragraphs as you write them?""",
          ("Not what I wanted", "dissatisfied")),
        U("ugh fine, the outline then", ("I didn't have the energy to argue", "follow_up")),
        A("""1. **Introduction:** author, title, one-sentence summary, thesis.
2. **Summary:** Jonas's community, the Ceremony of Twelve, his training with the Giver.
3. **Theme 1 – Memory:** what the community lost by forgetting.
4. **Theme 2 – Freedom vs. safety:** the cost of Sameness.
5. **Your opinion:** did you like the ending? Would you want to live there?
6. **Conclusion:** restate the thesis and why the book still matters.""",
          ("Ok", "neutral")),
    ]),
    TT("user30", 2, "gpt-4o", "Plan an 18th birthday party in a small apartment",
       "Theme ideas and a shopping list for 12 people within budget", [
        U("birthday party ideas for my 18th, 12 people, small apartment",
          ("I wanted some ideas", "information_seeking")),
        U("budget 150 euros btw",
          ("I forgot to mention the budget so I sent it quickly", "follow_up")),
        A("""Fun themes that work in a small space:

1. **Y2K party:** butterfly clips, low-rise jeans, 2000s pop playlist, disposable cameras.
2. **Karaoke night:** a YouTube karaoke playlist and a cheap microphone.
3. **Pizza and board games:** make-your-own pizza station and party games.

**Shopping list for 12 (≈ €140):**
- Pizza dough, sauce, cheese and toppings: €45
- Snacks and crisps: €20
- Soft drinks and juice: €20
- Birthday cake: €25
- Decorations (balloons, fairy lights): €15
- 2 disposable cameras: €15""",
          ("Love the Y2K theme", "satisfied")),
        U("a playlist too", ("I added a request after liking the theme", "new_request")),
        A("""Y2K playlist:
1. Toxic – Britney Spears
2. Crazy in Love – Beyoncé
3. Hey Ya! – OutKast
4. Complicated – Avril Lavigne
5. Hips Don't Lie – Shakira
6. Mr. Brightside – The Killers
7. Umbrella – Rihanna
8. Uptown Funk – Mark Ronson ft. Bruno Mars
9. Since U Been Gone – Kelly Clarkson
10. Single Ladies – Beyoncé""",
          ("Some songs are not Y2K at all, Uptown Funk is 2014", "dissatisfied")),
    ]),
    # ---------------- user31: chef ----------------
    TT("user31", 1, "gpt-4o", "Write menu descriptions for a new seasonal menu",
       "Short, appetizing descriptions for five dishes that fit a casual restaurant", [
        U("write menu descriptions: 1) braised lamb shoulder, white beans, salsa verde 2) burrata, roasted peaches, basil 3) cod, brown butter, capers 4) mushroom risotto 5) chocolate olive oil cake",
          ("I need the new menus printed by Thursday", "information_seeking")),
        A("""1. **Braised Lamb Shoulder:** slow-braised until meltingly tender, nestled on creamy white beans and finished with a vibrant, herbaceous salsa verde.
2. **Burrata & Roasted Peaches:** luscious burrata meets caramelised summer peaches, kissed with fragrant basil and a drizzle of golden olive oil.
3. **Cod with Brown Butter:** delicate, flaky cod bathed in nutty brown butter and brightened with briny capers.
4. **Wild Mushroom Risotto:** velvety arborio rice, slowly stirred with earthy mushrooms and aged parmesan.
5. **Chocolate Olive Oil Cake:** a decadent, moist chocolate cake with the fruity depth of extra-virgin olive oil.""",
          ("Too flowery", "dissatisfied")),
        U("less flowery. no more than 10 words each, don't mention 'luscious' or 'kissed', only the main ingredients",
          ("My restaurant is casual and I wanted to rule out that fancy style completely", "refinement")),
        A("""1. **Lamb shoulder:** slow-braised, white beans, salsa verde.
2. **Burrata:** roasted peaches, basil, olive oil.
3. **Cod:** brown butter, capers, lemon.
4. **Mushroom risotto:** parmesan, thyme.
5. **Chocolate olive oil cake:** crème fraîche.""",
          ("Good", "satisfied")),
    ]),
    TT("user31", 2, "gpt-4o-mini", "Scale a risotto recipe for a catering event",
       "The recipe scaled from 6 to 40 portions, in grams", [
        U("scale this to 40 portions, in grams: (6 portions) 2 cups arborio, 1.5 L stock, 1 onion, 60 g butter, 50 g parmesan, 150 ml white wine",
          ("Catering event this weekend", "information_seeking")),
        A("""Scaling factor: 40 ÷ 6 ≈ 6.67

| Ingredient | 6 portions | 40 portions |
|---|---|---|
| Arborio rice | 2 cups (≈ 400 g) | ≈ 2.65 kg |
| Stock | 1.5 L | 10 L |
| Onion | 1 (≈ 150 g) | ≈ 1 kg (about 7 onions) |
| Butter | 60 g | 400 g |
| Parmesan | 50 g | 335 g |
| White wine | 150 ml | 1 L |""",
          ("Numbers are right", "satisfied")),
        U("risotto for 40 in one pot is a bad idea btw. split it",
          ("I tested whether it would warn me about that, it didn't", "testing")),
        A("""Good point: a single 40-portion batch cooks unevenly and is very hard to stir. Better to split it into 4 batches of 10 portions each (≈ 665 g rice, 2.5 L stock per batch).

For catering, many kitchens also par-cook the risotto to about 70%, spread it on trays to cool quickly, and finish each batch to order with hot stock, butter and parmesan.""",
          ("OK", "neutral")),
    ]),
    # ---------------- user33: marketing ----------------
    TT("user33", 1, "gpt-4o", "Brainstorm slogans for a reusable water bottle launch",
       "10 slogan options in our playful brand voice, plus Spanish and French versions", [
        U("10 slogans for our reusable bottle launch", ("Brainstorming session", "information_seeking")),
        A("""1. Refill your world.
2. Sip sustainably.
3. One bottle, endless refills.
4. Hydration without the waste.
5. Drink better. Waste less.
6. Your planet-friendly sidekick.
7. Carry less plastic.
8. Good for you, good for Earth.
9. The last bottle you'll need.
10. Refill. Reuse. Repeat.""",
          ("A few are ok", "neutral")),
        U("none of these. make it better",
          ("I couldn't say what I wanted, I just knew these weren't it", "refinement")),
        A("""Could you tell me a bit about the brand voice? In the meantime, here are options in three different tones:

**Playful**
1. Thirsty? We've got a refill for that.
2. Plastic is so last season.
3. Sip happens.

**Bold**
4. Stop buying water. Start carrying it.
5. One bottle. Zero excuses.

**Minimal**
6. Fill. Go.
7. Water, on repeat.

**Witty**
8. Hydrate like you mean it.
9. Your bottle called. It wants a refill.
10. Less plastic, more splash.""",
          ("The playful ones are closer", "satisfied")),
        U("playful ones, also in Spanish and French for the EU launch",
          ("Now I also want translations, that came up in my team's meeting", "new_request")),
        A("""**Español**
1. ¿Sed? Tenemos una recarga para eso.
2. El plástico ya pasó de moda.
3. Un sorbo y a seguir.

**Français**
1. Soif ? On a une recharge pour ça.
2. Le plastique, c'est tellement dépassé.
3. Une gorgée, et c'est reparti.

Note: "Sip happens" is a pun that doesn't translate directly, so I adapted it rather than translating it literally.""",
          ("Good", "satisfied")),
    ]),
    TT("user33", 2, "gpt-4o-mini", "Write a newsletter intro for a spring sale",
       "A short, friendly intro announcing 20% off", [
        U("newsletter intro for spring sale, 20% off", ("Monthly newsletter task", "information_seeking")),
        A("""Spring has sprung, and so has our biggest sale of the season! 🌷 For one week only, enjoy **20% off everything** in store and online. Whether you're refreshing your wardrobe or treating yourself to something new, now's the perfect time. Happy spring!""",
          ("Nice", "satisfied")),
        U("ok", ("It was fine, nothing to add", "follow_up")),
        A("Great! Good luck with the sale."),
    ]),
]


def build_thoughttrace(spec: dict) -> dict:
    t = _rand_date("2025-01-06", "2025-03-28").replace(hour=rng.randrange(8, 23))
    msgs = []
    prev_type = None
    for i, (typ, text, notes) in enumerate(spec["messages"], start=1):
        if i > 1:
            if typ == "user" and prev_type == "user":
                t += timedelta(seconds=rng.randrange(12, 70))
            elif typ == "user":
                t += timedelta(seconds=rng.randrange(25, 300) + len(text) // 5)
            else:
                t += timedelta(seconds=rng.randrange(3, 15) + len(text) // 90)
        m = {"id": f"m{i}", "timestamp": iso(t), "type": typ, "content": text}
        key = "reasons" if typ == "user" else "reactions"
        ann = []
        nt = t
        for content, label in notes:
            nt = nt + timedelta(seconds=rng.randrange(10, 95))
            ann.append({"content": content, "label": label, "timestamp": iso(nt)})
        m[key] = ann
        msgs.append(m)
        prev_type = typ
    return {
        "id": f"{spec['user']}_task{spec['task']}_conversation1",
        "model_name": spec["model"],
        "task_summary": spec["summary"],
        "task_expectation": spec["expectation"],
        "survey_answers": [dict(TT_SURVEYS[spec["user"]])],
        "messages": msgs,
    }

# ---------------------------------------------------------------------------
# 3. ABCD-style customer-service conversations
# ---------------------------------------------------------------------------

FLOW_OF = {
    "recover_username": "account_access", "recover_password": "account_access", "reset_2fa": "account_access",
    "manage_change_address": "manage_account", "manage_change_phone": "manage_account",
    "status_credit_missing": "manage_account",
    "status_delivery_time": "order_issue", "manage_cancel": "order_issue", "status_mystery_fee": "order_issue",
    "refund_initiate": "product_defect", "return_size": "product_defect", "return_color": "product_defect",
    "bad_price_competitor": "purchase_dispute", "promo_code_invalid": "purchase_dispute",
    "status": "shipping_issue", "missing": "shipping_issue", "cost": "shipping_issue",
    "pricing": "storewide_query", "membership": "storewide_query", "policy": "storewide_query",
    "status_due_amount": "subscription_inquiry", "manage_pay_bill": "subscription_inquiry",
}

# Required action buttons per subflow, in order (our own support manual).
KB = {
    "recover_username": ["pull-up-account", "verify-identity"],
    "recover_password": ["pull-up-account", "enter-details", "make-password"],
    "reset_2fa": ["pull-up-account", "enter-details", "send-link"],
    "manage_change_address": ["pull-up-account", "verify-identity", "record-reason", "update-account"],
    "manage_change_phone": ["pull-up-account", "verify-identity", "record-reason", "update-account"],
    "status_credit_missing": ["pull-up-account", "validate-purchase", "ask-the-oracle", "promo-code"],
    "status_delivery_time": ["pull-up-account", "validate-purchase", "shipping-status", "ask-the-oracle", "update-order"],
    "manage_cancel": ["pull-up-account", "validate-purchase", "shipping-status", "record-reason", "update-order"],
    "status_mystery_fee": ["pull-up-account", "validate-purchase", "ask-the-oracle", "membership", "update-order"],
    "refund_initiate": ["pull-up-account", "validate-purchase", "record-reason", "enter-details", "offer-refund"],
    "return_size": ["pull-up-account", "validate-purchase", "membership", "enter-details", "update-order"],
    "return_color": ["pull-up-account", "validate-purchase", "membership", "enter-details", "update-order"],
    "bad_price_competitor": ["pull-up-account", "record-reason", "validate-purchase", "search-policy", "promo-code"],
    "promo_code_invalid": ["pull-up-account", "validate-purchase", "ask-the-oracle", "promo-code"],
    "status": ["pull-up-account", "validate-purchase", "shipping-status", "update-order"],
    "missing": ["pull-up-account", "validate-purchase", "record-reason", "make-purchase"],
    "cost": ["pull-up-account", "validate-purchase", "membership", "shipping-status", "offer-refund"],
    "pricing": ["search-faq", "search-pricing"],
    "membership": ["search-faq", "search-membership"],
    "policy": ["search-faq", "search-policy"],
    "status_due_amount": ["pull-up-account", "verify-identity", "subscription-status"],
    "manage_pay_bill": ["pull-up-account", "verify-identity", "subscription-status", "enter-details", "update-account"],
}

BRANDS = ["tommy_hilfiger", "calvin_klein", "michael_kors", "guess"]
PTYPES = ["shirt", "jeans", "boots", "jacket"]
PRICE_RANGE = {"shirt": (29, 89), "jeans": (49, 129), "boots": (79, 249), "jacket": (69, 229)}
CITIES = ["brighton", "raleigh", "monterey", "newark", "jacksonville", "lincoln", "springfield", "baltimore",
          "la fayette", "portland", "san lima", "austin", "king's creek", "highland park", "redmond"]
STATES = ["ca", "ny", "tx", "mi", "wa", "az", "ma", "fl", "ga", "oh", "nj", "il", "co"]
STREETS = ["main st", "lincoln ave", "1st ave", "elm st", "oak ln", "lake blvd", "circle drive", "brushy trail",
           "kingston st", "pine ave", "sunset blvd", "river rd", "cedar ct", "maple st", "hillcrest dr"]


class Ctx:
    """Everything a dialogue builder needs about one scenario."""

    def __init__(self, sc: dict, style: str, variant: str, r: random.Random):
        self.sc, self.style, self.variant, self.r = sc, style, variant, r
        p, o = sc["personal"], sc["order"]
        self.name = p["customer_name"]
        self.Name = " ".join(w[:1].upper() + w[1:] if "'" not in w else w.title() for w in self.name.split())
        self.first = self.Name.split()[0]
        self.username, self.email, self.phone = p["username"], p["email"], p["phone"]
        self.level = p["member_level"]
        self.order_id, self.zip, self.street = o["order_id"], o["zip_code"], o["street_address"]
        self.full_address = o["full_address"]
        self.payment = o["payment_method"]
        self.product = sc["product"]["names"][0]
        self.item = self.product.replace("_", " ").title().replace(" Shirt", " shirt").replace(" Jeans", " jeans") \
            .replace(" Boots", " boots").replace(" Jacket", " jacket")
        self.ptype = self.product.split()[-1]
        plural = self.ptype in ("jeans", "boots")
        self.a_item = f"a pair of {self.item}" if plural else f"a {self.item}"
        self.a_ptype = f"a pair of {self.ptype}" if plural else f"a {self.ptype}"
        self.amount = sc["product"]["amounts"][0]
        self.extra: dict[str, str] = {}  # other values to delexicalise: value -> placeholder

    def pick(self, *options):
        return self.r.choice(options)


def act(text, button, values=None):
    return ("action", text, button, list(values or []))


def ag(text):
    return ("agent", text)


def cu(text):
    return ("customer", text)


GREETINGS = [
    "Hi, thank you for contacting us. How can I help you today?",
    "Hello! How may I help you?",
    "Good morning, how can I help you?",
    "Hi there, what can I do for you today?",
    "Thanks for reaching out! What can I help you with?",
    "Hello, thanks for waiting. How can I assist?",
]
WRAP_ASK = ["Is there anything else I can help you with today?", "Anything else I can do for you?",
            "Can I help with anything else?", "Is there anything else you need?"]
WRAP_NO = {
    "polite": ["No, that's everything. Thank you so much for your help!", "That's all, thank you!", "Nope, you've been very helpful. Have a good one!"],
    "impatient": ["no", "No. Bye.", "nope that's it"],
    "confused": ["I think that's it? Thanks for being patient with me.", "No, that's all. Sorry it took so long!"],
    "piecemeal": ["No, that's all, thanks.", "That's it for now, thanks."],
    "chatty": ["Nope! Thanks a bunch, you've been lovely.", "That's all! Have a great rest of your day."],
}
BYE = ["Have a great day!", "Thank you for contacting us, take care!", "You're welcome, have a nice day!",
       "Have a wonderful evening!", "Take care!"]
IMPATIENT_PINGS = ["hello?", "Can we speed this up please?", "I've been waiting forever.", "how long is this going to take",
                   "ok ok", "Seriously, I don't have time for this."]
CHATTY_ASIDES = ["Sorry, my dog is going crazy at the mail carrier lol.", "It's been such a long week, honestly.",
                 "I'm on my lunch break so this is perfect timing.", "My sister actually recommended your store to me!"]


def opening(c: Ctx, request: list[str]) -> list:
    out = []
    if c.style == "impatient" and c.r.random() < 0.6:
        out.append(cu(c.pick("hello??", "Hi. Anyone there?", "hi")))
        out.append(ag(c.pick(*GREETINGS)))
    else:
        out.append(ag(c.pick(*GREETINGS)))
    for line in request:
        out.append(cu(line))
    if c.style == "chatty":
        out.append(cu(c.pick(*CHATTY_ASIDES)))
    return out


def closing(c: Ctx, skip_ask=False) -> list:
    if skip_ask:
        return [ag(c.pick(*BYE))]
    return [ag(c.pick(*WRAP_ASK)), cu(c.pick(*WRAP_NO[c.style])), ag(c.pick(*BYE))]


def ask_name(c: Ctx) -> list:
    out = [ag(c.pick("Sure, may I have your full name please?", "I can help with that. Can I get your full name?",
                     "Happy to help. Could I have your first and last name?", "Of course. What is your full name?"))]
    if c.style == "piecemeal":
        out.append(cu(c.first))
        out.append(ag("And your last name?"))
        out.append(cu(c.Name.split(" ", 1)[1]))
    elif c.style == "impatient":
        out.append(cu(c.name))
    else:
        out.append(cu(c.pick(c.Name, f"It's {c.Name}.", f"{c.Name}")))
    out.append(act(f"Account has been pulled up for {c.Name}.", "pull-up-account", [c.name]))
    return out


def give_fields(c: Ctx, fields: list[str]) -> list:
    """Customer provides the requested identity fields (style-dependent)."""
    say = {
        "username": [f"username is {c.username}", f"{c.username}", f"Username: {c.username}"],
        "email": [f"{c.email}", f"email is {c.email}", f"my email is {c.email}"],
        "order_id": [f"Order ID: {c.order_id}", f"the order id is {c.order_id}", f"{c.order_id}"],
        "zip_code": [f"zip is {c.zip}", f"{c.zip}", f"My zip code is {c.zip}"],
        "phone": [f"{c.phone}", f"phone number is {c.phone}"],
    }
    if c.style == "piecemeal" or (c.style == "confused" and len(fields) > 1):
        out = []
        for i, f in enumerate(fields):
            if c.style == "confused" and f == "order_id":
                out.append(cu("Sorry, where do I find the order ID?"))
                out.append(ag("It's a 10-digit number in your confirmation email or on your receipt."))
                out.append(cu(f"Oh okay, found it. {c.order_id}"))
                continue
            out.append(cu(c.r.choice(say[f])))
            if c.style == "piecemeal" and i < len(fields) - 1 and c.r.random() < 0.5:
                out.append(ag(c.pick("Thanks, and the next one?", "Got it. And the rest?", "Great, thank you. What else do you have?")))
        return out
    if c.style == "impatient":
        raw = {"username": c.username, "email": c.email, "order_id": c.order_id, "zip_code": c.zip, "phone": c.phone}
        return [cu(", ".join(raw[f] for f in fields))]
    parts = [c.r.choice(say[f]) for f in fields]
    if len(parts) > 2 and c.r.random() < 0.5:
        return [cu(parts[0]), cu(", ".join(parts[1:]))]
    raw_values = (c.username, c.email, c.order_id, c.zip, c.phone)
    # capitalise sentence starts, but never alter a value the customer typed
    parts = [p if p.startswith(raw_values) else p[:1].upper() + p[1:] for p in parts]
    return [cu(". ".join(parts) + ".")]


def validate(c: Ctx, lead=None) -> list:
    out = [ag(lead or c.pick("Thanks. To validate the purchase, I'll need your username, email address and order ID.",
                             "Could you also give me your username, email and the order ID?",
                             "Great. Next I need the username, email address and order ID for this purchase."))]
    out += give_fields(c, ["username", "email", "order_id"])
    if c.style == "impatient" and c.r.random() < 0.5:
        out.append(cu(c.pick(*IMPATIENT_PINGS)))
    out.append(act("Purchase validation in progress ...", "validate-purchase", [c.username, c.email, c.order_id]))
    return out


def verify(c: Ctx, fields=("zip_code", "phone"), lead=None) -> list:
    out = [ag(lead or c.pick("To verify your identity, can I have your zip code and phone number?",
                             "For security, please confirm your zip code and the phone number on the account.",
                             "I just need to verify your identity. What's your zip code and phone number?"))]
    out += give_fields(c, list(fields))
    vals = [c.name] + [{"zip_code": c.zip, "phone": c.phone, "email": c.email, "order_id": c.order_id}[f] for f in fields]
    out.append(act("Identity verification in progress ...", "verify-identity", vals))
    return out


# ---- per-subflow dialogue builders -------------------------------------------------

def b_recover_username(c: Ctx):
    e = opening(c, [c.pick("Hi, I forgot my username and now I can't log in.",
                           "hey i cant remember what username i used for my account",
                           "Hello, I'm trying to log in but I don't remember my username.")])
    e += ask_name(c)
    e.append(ag("Thanks. To verify your identity I'll need your zip code, phone number and email address."))
    e += give_fields(c, ["zip_code", "phone", "email"])
    e.append(act("Identity verification in progress ...", "verify-identity", [c.name, c.zip, c.phone, c.email]))
    e.append(ag(f"Thank you, {c.first}. Your username is {c.username}."))
    if c.style == "confused":
        e.append(cu(f"Is that with the numbers at the end? {c.username}?"))
        e.append(ag("Yes, exactly as written, all lowercase with the numbers at the end."))
        e.append(cu("Can I change it to something easier to remember?"))
        e.append(ag("I'm sorry, usernames can't be changed once the account is created. You could save it in your browser or a password manager so you don't have to remember it."))
        e.append(cu("Okay, I'll write it down."))
    else:
        e.append(cu(c.pick("Perfect, that's it! Thanks.", "Ah of course. Thank you!")))
    return e + closing(c)


def b_recover_password(c: Ctx):
    repeat = c.variant == "repeat"
    req = ["Hi, I reset my password with you guys this morning and it already stopped working.", "I need a new one."] if repeat else \
        [c.pick("I need to reset my password, I'm locked out.", "Hi there, I forgot my password and the reset email never arrives.")]
    e = opening(c, req)
    if repeat:
        e.append(ag("I'm sorry about that! Let's generate a fresh one. Can I have your full name?"))
        e.append(cu(c.Name))
        e.append(act(f"Account has been pulled up for {c.Name}.", "pull-up-account", [c.name]))
    else:
        e += ask_name(c)
    e.append(ag(c.pick("Thanks. What is your username or the email address on the account?",
                       "Can you give me your username so I can check your identity?")))
    e += give_fields(c, ["username"])
    e.append(act(f"Details of {c.username} have been entered.", "enter-details", [c.username]))
    e.append(ag("I'm not able to see or send your old password, but I can generate a new one for you. I'll need your PIN number or the answer to your security question."))
    pin = str(c.r.randrange(1000, 9999))
    c.extra[pin] = "<pin_number>"
    if c.style == "impatient":
        e.append(cu("Why do you need all this, I just want to log in."))
        e.append(ag("I understand, it's to make sure nobody else can take over your account. It'll only take a moment."))
        e.append(cu(f"fine. pin {pin}"))
    else:
        e.append(cu(c.pick(f"My PIN is {pin}.", f"The pin number should be {pin}")))
    e.append(act("A password has been generated.", "make-password", [pin]))
    pw = f"{c.first.lower()}{c.r.randrange(100, 999)}{c.pick('x', 'k', 'z', 'q')}"
    c.extra[pw] = "<password>"
    e.append(ag(f"Your new temporary password is {pw}. Please change it after you log in."))
    e.append(cu(c.pick("Got it, I'm in. Thanks.", "It worked, thank you!")))
    return e + closing(c)


def b_reset_2fa(c: Ctx):
    e = opening(c, [c.pick("I got a new phone and now I can't get past the two-factor code.",
                           "Hello, I need to reset my two-factor authentication.")])
    e += ask_name(c)
    if c.variant == "sms":
        e.append(cu("Can you just text the code to my new number? I'm in a rush."))
        e.append(ag("I'm sorry, for security reasons two-factor authentication can only be reset by sending a link to the email address on file. I can't do it by text message or to a new number."))
        e.append(cu(c.pick("Ugh. Fine.", "that's ridiculous but ok")))
    e.append(ag("What is the email address on your account?"))
    e += give_fields(c, ["email"])
    e.append(act(f"Details of {c.email} have been entered.", "enter-details", [c.email]))
    e.append(ag("Thanks. I'm sending a reset link to that email now. I'll also include our guide to account security best practices."))
    e.append(act("A link will be sent.", "send-link", []))
    e.append(cu(c.pick("Got it, I see the email.", "Ok it just came through.", "Great, thank you!")))
    e.append(ag("Once you click the link you'll be able to set up two-factor authentication on your new phone."))
    return e + closing(c)


def b_change_address(c: Ctx):
    new_street = f"{c.r.randrange(100, 9999)} {c.r.choice(STREETS)}"
    c.extra[new_street] = "<street_address>"
    e = opening(c, [c.pick("Hi, I moved recently and need to update the address on my account.",
                           "I need to change my shipping address.")])
    e += ask_name(c)
    e += verify(c, ("zip_code", "phone"), lead="To verify your identity, please give me the zip code and phone number currently on the account.")
    e.append(ag("Thank you. May I ask why you're changing the address?"))
    e.append(cu(c.pick("I moved to a new apartment.", "We just moved house.")))
    e.append(act("A reason of moved has been recorded.", "record-reason", ["moved"]))
    e.append(ag("What's the new street address?"))
    if c.style == "piecemeal":
        e.append(cu(f"It's {new_street}"))
        e.append(cu("Same city and zip."))
    else:
        e.append(cu(f"{new_street}, same city and zip code."))
    if c.variant == "username_change":
        e.append(cu("Oh, and while you're at it can you change my username too? I don't like it anymore."))
        e.append(ag("I'm sorry, the account username cannot be changed. I can only update details like your address and phone number."))
        e.append(cu("Oh well. Just the address then."))
    e.append(act(f"Account has been updated with {new_street}.", "update-account", [new_street]))
    e.append(ag(f"All done, your address is now {new_street}. Any orders that have already shipped will still go to the old address."))
    return e + closing(c)


def b_change_phone(c: Ctx):
    new_phone = f"({c.r.randrange(201, 989)}) {c.r.randrange(200, 999)}-{c.r.randrange(1000, 9999)}"
    c.extra[new_phone] = "<phone>"
    e = opening(c, [c.pick("I need to change the phone number on my account.", "Hi, I got a new number and want to update it.")])
    e += ask_name(c)
    e += verify(c, ("zip_code", "phone"), lead="Sure. Can you verify the zip code and the current phone number on the account?")
    if c.style == "chatty":
        e.append(cu("My old number is from college, can you believe I kept it that long?"))
    e.append(ag("Thanks! Why are you changing the number?"))
    e.append(cu("I switched carriers and got a new number."))
    e.append(act("A reason of new number has been recorded.", "record-reason", ["new number"]))
    e.append(ag("What's the new number?"))
    e.append(cu(new_phone))
    e.append(act(f"Account has been updated with {new_phone}.", "update-account", [new_phone]))
    e.append(ag(f"Done! Your phone number is now {new_phone}."))
    return e + closing(c)


def b_credit_missing(c: Ctx):
    credit = c.pick(10, 15, 20, 25)
    e = opening(c, [f"I was promised a ${credit} credit on my account after my last order but I don't see it anywhere."])
    if c.style == "impatient":
        e.append(cu("This is the second time I'm asking about this."))
    e += ask_name(c)
    e += validate(c)
    e.append(ag("Thank you. Where did the credit come from?"))
    e.append(cu("The last agent said I'd get it because my order arrived late."))
    e.append(act("A reason of late delivery credit has been recorded.", "record-reason", ["late delivery credit"]))
    e.append(ag("Let me check whether the credit was applied."))
    e.append(act("Querying the system for an answer ...", "ask-the-oracle", []))
    e.append(ag("I see the problem: the credit was approved but never added to your account. I'll create a promo code for the same amount."))
    e.append(act("A promo code has been created.", "promo-code", []))
    code = f"CREDIT{c.r.randrange(1000, 9999)}"
    c.extra[code] = "<promo_code>"
    e.append(ag(f"Your code is {code}, worth ${credit}. Like all promo codes it expires after 7 days, so use it soon."))
    e.append(cu(c.pick("Okay, thanks for fixing it.", "finally. thanks")))
    return e + closing(c)


def b_delivery_time(c: Ctx):
    repeat = c.variant == "repeat"
    req = ["I'm back again about my order, it STILL hasn't arrived.", "Yesterday someone told me it would be here in a day."] if repeat else \
        [c.pick("Where is my order? It was supposed to be here already.", f"Hi, I ordered {c.a_item} almost two weeks ago and it hasn't arrived.")]
    e = opening(c, req)
    e += ask_name(c)
    e += validate(c)
    e.append(act("Shipping status of in transit has been noted.", "shipping-status", ["in transit"]))
    e.append(ag("Your order is currently in transit. Let me check the expected delivery date."))
    e.append(act("Querying the system for an answer ...", "ask-the-oracle", []))
    e.append(ag("It's past our 7 business day delivery window, so I'll upgrade your shipping to next-day at no extra charge."))
    if c.style == "impatient":
        e.append(cu("It better actually show up this time."))
    e.append(act("Order has been updated with next day shipping.", "update-order", ["next day shipping"]))
    e.append(ag("Done. You should receive it within one business day."))
    return e + closing(c)


def b_manage_cancel(c: Ctx):
    shipped = c.variant == "shipped"
    e = opening(c, [c.pick("I'd like to cancel an order I placed.", f"I need to cancel my order for the {c.item}.")])
    e += ask_name(c)
    e += validate(c)
    status = "in transit" if shipped else "order received"
    e.append(act(f"Shipping status of {status} has been noted.", "shipping-status", [status]))
    if shipped:
        e.append(ag("I'm sorry, your order has already shipped and is in transit. Orders can only be cancelled before they ship."))
        e.append(cu("You've got to be kidding. I placed it last night."))
        e.append(ag("I understand the frustration. Once it arrives you can return it, and as long as it's within the return window you'll get a full refund to your original payment method."))
        e.append(cu("Fine. How do I return it?"))
        e.append(ag("When it arrives, contact us and we'll set up the return by mail, in store, or at a drop-off center."))
        return e + closing(c)
    e.append(ag("Your order hasn't shipped yet, so I can cancel it. May I ask why?"))
    if c.style == "confused":
        e.append(cu("I think I ordered it twice by accident? I'm not sure."))
        e.append(ag("I see only one order with this ID, but I can still cancel this one if you no longer need it."))
        e.append(cu("Yes please, cancel it."))
    else:
        e.append(cu("I changed my mind."))
    e.append(act("A reason of changed mind has been recorded.", "record-reason", ["changed mind"]))
    e.append(act("Order has been updated with cancel order.", "update-order", ["cancel order"]))
    e.append(ag(f"Your order has been cancelled, and ${c.amount} will go back to your {c.payment} within 3-5 business days."))
    return e + closing(c)


def b_mystery_fee(c: Ctx):
    fee = c.pick(8, 12, 15)
    e = opening(c, [f"There's a ${fee} fee on my last order that I don't recognize."])
    if c.style == "impatient":
        e.append(cu("Nobody told me about any fee."))
    e += ask_name(c)
    e += validate(c)
    e.append(act("Querying the system for an answer ...", "ask-the-oracle", []))
    e.append(ag("The fee is an expedited handling charge that was added to this order. Can I ask your membership level?"))
    e.append(cu(c.pick(f"I'm {c.level}.", f"{c.level}", f"I think it's {c.level}")))
    e.append(act(f"Membership level of {c.level} has been noted.", "membership", [c.level]))
    if c.level in ("gold", "silver"):
        e.append(ag(f"As a {c.level} member you're eligible to have the fee waived. I'll remove it now."))
        e.append(act("Order has been updated with waive fee.", "update-order", ["waive fee"]))
        e.append(cu(c.pick("Great, thank you!", "Thanks a lot.")))
    else:
        e.append(ag(f"I'm sorry, fees can only be waived for gold and silver members. Since your account is {c.level}, the ${fee} charge has to stay."))
        e.append(cu("So I just have to pay it? That's annoying."))
        e.append(ag("I understand. If you reach silver status, future handling fees can be waived."))
    return e + closing(c)


def b_refund_initiate(c: Ctx):
    e = opening(c, [c.pick(f"I want a refund for the {c.item} I bought.", f"Hi, I'd like to get my money back for {c.a_ptype}.")])
    e += ask_name(c)
    e += validate(c)
    e.append(ag("Thank you. What's the reason for the refund?"))
    defect = {"shirt": ["A seam ripped the first time I wore it.", "The buttons keep falling off."],
              "jeans": ["The zipper broke after two days.", "The stitching on the pocket came apart."],
              "boots": ["The sole is already peeling off.", "One of the heels cracked after a week."],
              "jacket": ["The zipper broke after two days.", "The lining tore the first time I wore it."]}[c.ptype]
    e.append(cu(c.pick(*defect)))
    e.append(act("A reason of defective item has been recorded.", "record-reason", ["defective item"]))
    if c.variant == "paper_check":
        e.append(cu("Can you send me a paper check? I don't really use that account anymore."))
        e.append(ag(f"I'm sorry, refunds can only be issued to the original payment method, which for this order is {c.payment}."))
        e.append(cu("Hmm. Okay, I guess that works."))
    acct = "".join(c.r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(10))
    c.extra[acct] = "<account_id>"
    c.extra[acct.lower()] = "<account_id>"
    e.append(ag(f"I'll send the refund to your {c.payment}. Can you confirm your account ID? It's in your profile settings."))
    e.append(cu(acct))
    e.append(act(f"Details of {acct} have been entered.", "enter-details", [acct]))
    e.append(act(f"A refund has been made for the amount of ${c.amount}.", "offer-refund", [str(c.amount)]))
    e.append(ag(f"A refund of ${c.amount} has been issued. It should appear in 5-7 business days."))
    return e + closing(c)


def b_return(c: Ctx, reason: str):
    repeat = c.variant == "repeat"
    if reason == "size":
        req = [c.pick(f"I need to return the {c.item}, it's way too small.", "Hi, I have to return something, it doesn't fit.")]
    else:
        req = [c.pick(f"The {c.ptype} I got is a totally different color than the picture.", f"Hi, I want to return the {c.item} because of the color.")]
    if repeat:
        req = ["Hi, I started a return for this last week but it doesn't show up in my account.", "Can we do it again? Same order."]
    e = opening(c, req)
    e += ask_name(c)
    e += validate(c)
    e.append(ag(c.pick("Thanks! What's your membership level?", f"Thank you, {c.first}. Could you tell me your membership level?")))
    if c.style == "confused":
        e.append(cu("Membership? I'm not sure I have one."))
        e.append(ag("It's on your account page, under your name: guest, bronze, silver or gold."))
    e.append(cu(c.pick(f"{c.level.capitalize()}.", f"I'm a {c.level} member.", f"it says {c.level}")))
    e.append(act(f"Membership level of {c.level} has been noted.", "membership", [c.level]))
    if c.level != "gold":
        e.append(ag("And was the purchase made within the last 90 days?"))
        if c.variant == "too_old":
            e.append(cu("No, I bought it back in the fall. Like October?"))
            e.append(ag("I'm sorry, returns are only accepted within 90 days of purchase for non-gold members, so I'm not able to process this return."))
            e.append(cu("What if I ask really nicely? I barely wore it."))
            e.append(ag("I can ask my manager to review it. Could I have a phone number for them to reach you?"))
            e.append(cu(c.phone))
            e.append(act(f"Details of {c.phone} have been entered.", "enter-details", [c.phone]))
            e.append(act("The manager has been notified.", "notify-team", ["manager"]))
            e.append(ag("My manager will call you within 2 business days. I'm sorry I couldn't do more."))
            return e + closing(c)
        e.append(cu(c.pick("Yes, about a month ago.", "yes, a few weeks ago")))
    else:
        e.append(ag("As a gold member you have unlimited returns, so there's no time limit."))
    e.append(ag("I'll need the address we should send the return label to."))
    e.append(cu(c.pick(f"{c.full_address}", f"It's {c.street}, {c.zip}")))
    e.append(act(f"Details of {c.full_address} have been entered.", "enter-details", [c.full_address]))
    e.append(ag("How would you like to return it: by mail, in store, or at a drop-off center?"))
    method = c.pick("by mail", "in store", "drop off center")
    e.append(cu({"by mail": "By mail please.", "in store": "I'll take it to a store.", "drop off center": "Drop-off center is easiest."}[method]))
    e.append(act(f"Order has been updated with {method}.", "update-order", [method]))
    e.append(ag("All set. Your refund will be issued to your original payment method once we receive the item."))
    return e + closing(c)


def b_bad_price(c: Ctx):
    e = opening(c, [c.pick(f"I just saw the same {c.ptype} for way cheaper at another store.", f"I bought {c.item} from you and now it's $20 cheaper somewhere else.")])
    e += ask_name(c)
    e.append(ag("I'm sorry about that. Where did you see the lower price?"))
    e.append(cu(c.pick("At a competitor's website.", "At the department store downtown.")))
    e.append(act("A reason of competitor has been recorded.", "record-reason", ["competitor"]))
    e += validate(c)
    e.append(act("System Action: search policy", "search-policy", []))
    if c.variant == "sale":
        e.append(ag("Is their price a regular price or part of a sale?"))
        e.append(cu("It's their Black Friday sale. Why does that matter?"))
        e.append(ag("I'm sorry, we don't price-match competitors for items on sale or clearance, only for their regular prices."))
        e.append(cu("That's a ridiculous policy. Can you make an exception?"))
        e.append(ag("I understand the frustration, but I'm not able to make an exception. Your item is still within the return window if you'd prefer to return it."))
        e.append(cu("Whatever."))
        return e + closing(c)
    e.append(ag("Their regular price qualifies for our price match. I'll give you the difference as a promo code."))
    e.append(act("A promo code has been created.", "promo-code", []))
    code = f"MATCH{c.r.randrange(1000, 9999)}"
    c.extra[code] = "<promo_code>"
    e.append(ag(f"Your code is {code}. Note that promo codes expire after 7 days."))
    e.append(cu("Great, thanks for matching it."))
    return e + closing(c)


def b_promo_invalid(c: Ctx):
    code = c.pick("SPRING20", "WELCOME15", "SAVE10NOW")
    e = opening(c, [f"The promo code {code} isn't working on my order."])
    e += ask_name(c)
    e += validate(c)
    e.append(act("Querying the system for an answer ...", "ask-the-oracle", []))
    if c.variant == "shipped":
        e.append(ag("I see the order was placed and has already shipped. Unfortunately, promo codes cannot be applied to orders that have already shipped."))
        e.append(cu("But I tried to use it at checkout and it failed! That's your website's fault."))
        e.append(ag("I'm sorry for the trouble. The code is still valid for 7 days from when you received it, so you can use it on your next order."))
        e.append(cu("Not very helpful, but fine."))
        return e + closing(c)
    e.append(ag("It looks like the code failed because of a system error on our side. I'll generate a replacement for you."))
    e.append(act("A promo code has been created.", "promo-code", []))
    new = f"{code[:4]}{c.r.randrange(100, 999)}"
    c.extra[new] = "<promo_code>"
    e.append(ag(f"Your new code is {new}. It expires after 7 days."))
    e.append(cu("Thank you!"))
    return e + closing(c)


def b_ship_status(c: Ctx):
    status = c.pick("out for delivery", "in transit")
    e = opening(c, [c.pick("Can you tell me if my order has shipped yet?", "Hi, I'm trying to find out where my package is.")])
    e += ask_name(c)
    e += validate(c)
    e.append(act(f"Shipping status of {status} has been noted.", "shipping-status", [status]))
    e.append(ag(f"Your order is {status}."))
    if c.style == "confused":
        e.append(cu("What does that mean exactly? Will it be here today?"))
        e.append(ag("It means it's on its way but not with the local driver yet. If you need it sooner, I can upgrade it to next-day shipping."))
        e.append(cu("Oh, yes please, it's a birthday present."))
    else:
        e.append(cu("Can you make sure it gets here by Friday? It's a gift."))
        e.append(ag("I can upgrade it to next-day shipping so it arrives in time."))
    e.append(act("Order has been updated with next day shipping.", "update-order", ["next day shipping"]))
    e.append(ag("Done, it's been upgraded."))
    return e + closing(c)


def b_missing(c: Ctx):
    e = opening(c, [c.pick("My package came but one of the items is missing.", f"I got my box today but the {c.ptype} wasn't in it.")])
    e += ask_name(c)
    e += validate(c)
    e.append(ag(f"I'm sorry about that. Just to confirm, the missing item is the {c.item}?"))
    e.append(cu("Yes, the box only had the receipt and some tissue paper in it."))
    e.append(act("A reason of missing item has been recorded.", "record-reason", ["missing item"]))
    e.append(ag("Since the order shows as delivered and you're contacting us within 30 days, I can send a replacement at no cost."))
    e.append(act(f"A purchase of {c.product} was made.", "make-purchase", [c.product]))
    e.append(ag("The replacement has been ordered and will ship to the address on file."))
    e.append(cu("Oh that's great, I was worried I'd have to argue about it."))
    return e + closing(c)


def b_ship_cost(c: Ctx):
    fee = c.pick(9, 12, 18)
    e = opening(c, [f"Why was I charged ${fee} for shipping? I want that refunded."])
    e += ask_name(c)
    e += validate(c)
    e.append(ag("What is your membership level?"))
    e.append(cu(c.level))
    e.append(act(f"Membership level of {c.level} has been noted.", "membership", [c.level]))
    e.append(act("Shipping status of in transit has been noted.", "shipping-status", ["in transit"]))
    e.append(ag(f"I'm sorry, your order has already shipped, and shipping fees are non-refundable once an order has shipped. Free shipping is a gold member benefit, and your account is {c.level}."))
    e.append(cu("That makes no sense. I'm a loyal customer."))
    e.append(ag("I understand, and I appreciate your loyalty. I'm not able to refund the fee on a shipped order."))
    e.append(cu("Fine. I'm done."))
    return e + closing(c, skip_ask=True)


def b_faq(c: Ctx, topic: str):
    q = {
        "pricing": [("How much does gift wrapping cost?", "Gift wrapping is $5 per item, and it's free for gold members."),
                    ("Do you charge extra for overnight shipping?", "Overnight shipping is $25 for all members except gold, who get it free.")],
        "membership": [("What do I get if I become a gold member?", "Gold members get free shipping, unlimited returns, and unexpected fees waived. You qualify after spending $1,000 in a calendar year.")],
        "policy": [("Can I return something I bought in the store through the website?", "Yes, in-store purchases can be returned online or in any store, within the same return window: 90 days for non-gold members and unlimited for gold.")],
    }[topic]
    question, answer = c.r.choice(q)
    e = []
    if c.r.random() < 0.5:
        e.append(cu("Hi, quick question."))
        e.append(ag(c.pick(*GREETINGS)))
        e.append(cu(question))
    else:
        e += opening(c, [question])
    if c.style == "confused":
        e.append(cu("Sorry, I'm not sure if this is the right place to ask."))
        e.append(ag("It is! Let me look that up for you."))
    else:
        e.append(ag(c.pick("Let me check that for you.", "Good question, one moment please.")))
    e.append(act("Searching the FAQ pages ...", "search-faq", []))
    e.append(act(f"System Action: search {topic}", f"search-{topic}", []))
    e.append(ag(answer))
    if c.style == "confused":
        e.append(cu("Oh okay. And how do I know what level I am?"))
        e.append(ag("You can see it on your account page, right under your name."))
    else:
        e.append(cu(c.pick("Good to know, thanks.", "Perfect, that answers it.")))
    return e + closing(c)


def b_due_amount(c: Ctx):
    due = c.pick(49, 59, 99)
    e = opening(c, [c.pick("How much do I owe on my premium subscription?", "Hi! Can you check my subscription balance?")])
    e += ask_name(c)
    e += verify(c, ("zip_code", "email"), lead="To verify your identity, can you give me your zip code and email address?")
    e.append(act("Querying the system for subscription status ...", "subscription-status", []))
    e.append(ag(f"Your annual premium subscription has ${due} due, with the payment due at the end of the month."))
    if c.style == "chatty":
        e.append(cu("Oh that's not bad at all. I mostly use it for the free shipping, ha."))
        e.append(ag("It definitely pays off if you order often!"))
    e.append(cu("Okay, I'll pay it next week."))
    return e + closing(c)


def b_pay_bill(c: Ctx):
    due = c.pick(49, 59, 99)
    e = opening(c, [c.pick("I want to pay my subscription bill.", "Hi, I'd like to pay what I owe for my subscription.")])
    e += ask_name(c)
    e += verify(c, ("zip_code", "phone"))
    e.append(act("Querying the system for subscription status ...", "subscription-status", []))
    e.append(ag(f"Your subscription has a balance of ${due}, due in 3 days."))
    if c.variant == "extension":
        e.append(cu("Can I push the due date back two months? Money is tight right now."))
        e.append(ag("I'm sorry, subscription bills cannot be extended more than 30 days. I can extend it by 30 days, or you can pay it now."))
        e.append(cu("Ugh, 30 days won't help. Just take the payment then."))
    e.append(ag("Which card would you like to use? I'll need the last four digits of the card on file."))
    last4 = str(c.r.randrange(1000, 9999))
    c.extra[last4] = "<card_digits>"
    e.append(cu(f"The {c.payment if c.payment in ('credit card', 'debit card') else 'credit card'} ending in {last4}."))
    e.append(act(f"Details of {last4} have been entered.", "enter-details", [last4]))
    e.append(act("Account has been updated with pay bill.", "update-account", ["pay bill"]))
    e.append(ag(f"Payment of ${due} was successful. You're all paid up!"))
    return e + closing(c)


BUILDERS = {
    "recover_username": b_recover_username, "recover_password": b_recover_password, "reset_2fa": b_reset_2fa,
    "manage_change_address": b_change_address, "manage_change_phone": b_change_phone,
    "status_credit_missing": b_credit_missing, "status_delivery_time": b_delivery_time,
    "manage_cancel": b_manage_cancel, "status_mystery_fee": b_mystery_fee, "refund_initiate": b_refund_initiate,
    "return_size": lambda c: b_return(c, "size"), "return_color": lambda c: b_return(c, "color"),
    "bad_price_competitor": b_bad_price, "promo_code_invalid": b_promo_invalid, "status": b_ship_status,
    "missing": b_missing, "cost": b_ship_cost, "pricing": lambda c: b_faq(c, "pricing"),
    "membership": lambda c: b_faq(c, "membership"), "policy": lambda c: b_faq(c, "policy"),
    "status_due_amount": b_due_amount, "manage_pay_bill": b_pay_bill,
}

# (customer name, subflow, style, member level or None, payment or None, split, variant)
# variant "repeat:<key>" re-uses the scenario of the conversation tagged <key>.
ABCD_PLAN = [
    ("maria gonzalez", "recover_username", "polite", None, None, "train", ""),
    ("kenji watanabe", "recover_username", "confused", None, None, "train", ""),
    ("priya raman", "recover_password", "impatient", None, None, "train", ""),
    ("marcus bell", "recover_password", "piecemeal", None, None, "train", "key:A"),
    ("olivia hart", "reset_2fa", "impatient", None, None, "train", "sms"),
    ("samuel okafor", "reset_2fa", "polite", None, None, "dev", ""),
    ("grace liu", "manage_change_address", "piecemeal", None, None, "train", "username_change"),
    ("tomas novak", "manage_change_address", "polite", None, None, "test", ""),
    ("hannah schultz", "manage_change_phone", "chatty", None, None, "train", ""),
    ("diego ramos", "status_credit_missing", "polite", None, None, "train", ""),
    ("aisha khan", "status_credit_missing", "impatient", None, None, "dev", ""),
    ("liam o'connor", "status_delivery_time", "impatient", None, None, "train", "key:B"),
    ("yuki tanaka", "status_delivery_time", "polite", None, None, "train", ""),
    ("fatima haddad", "manage_cancel", "confused", None, None, "train", ""),
    ("noah fischer", "manage_cancel", "impatient", None, None, "test", "shipped"),
    ("isabella rossi", "status_mystery_fee", "polite", "gold", None, "train", ""),
    ("ethan brooks", "status_mystery_fee", "impatient", "bronze", None, "train", ""),
    ("mei chen", "refund_initiate", "polite", None, "credit card", "train", ""),
    ("carlos mendes", "refund_initiate", "piecemeal", None, "paypal", "dev", "paper_check"),
    ("sofia petrova", "return_size", "chatty", "bronze", None, "train", "too_old"),
    ("jamal wright", "return_size", "polite", "gold", None, "test", ""),
    ("emma larsen", "return_color", "confused", "silver", None, "train", "key:C"),
    ("raj patel", "bad_price_competitor", "impatient", None, None, "train", "sale"),
    ("lucas silva", "bad_price_competitor", "polite", None, None, "train", ""),
    ("nora jensen", "promo_code_invalid", "polite", None, None, "train", ""),
    ("victor huang", "promo_code_invalid", "impatient", None, None, "dev", "shipped"),
    ("zoe adams", "status", "polite", None, None, "train", ""),
    ("omar farouk", "status", "confused", None, None, "train", ""),
    ("ruby nguyen", "missing", "chatty", None, None, "train", ""),
    ("felix wagner", "cost", "impatient", "bronze", None, "train", ""),
    ("ines moreau", "pricing", "polite", None, None, "train", ""),
    ("daniel kim", "membership", "confused", None, None, "train", ""),
    ("leah cohen", "policy", "polite", None, None, "train", ""),
    ("arjun mehta", "status_due_amount", "polite", None, None, "train", ""),
    ("claire dubois", "manage_pay_bill", "piecemeal", None, "debit card", "train", ""),
    ("ben carter", "manage_pay_bill", "impatient", None, "credit card", "test", "extension"),
    ("tara singh", "status_due_amount", "chatty", None, None, "train", ""),
    # the same customers calling again with exactly the same scenario
    ("marcus bell", "recover_password", "impatient", None, None, "train", "repeat:A"),
    ("liam o'connor", "status_delivery_time", "impatient", None, None, "dev", "repeat:B"),
    ("emma larsen", "return_color", "polite", "silver", None, "test", "repeat:C"),
]


def make_scenario(name: str, subflow: str, level, payment, variant: str) -> dict:
    first, last = name.split(" ", 1)
    username = f"{first[0]}{last.replace(chr(39), '').replace(' ', '')}{rng.randrange(100, 999)}"
    level = level or rng.choice(["gold", "silver", "bronze", "bronze", "guest"])
    payment = payment or rng.choice(["credit card", "credit card", "paypal", "debit card", "gift card"])
    city, state = rng.choice(CITIES), rng.choice(STATES)
    zip_code = f"{rng.randrange(10000, 99999)}"
    street = f"{rng.randrange(100, 9999)} {rng.choice(STREETS)}"
    n_products = 1 if rng.random() < 0.75 else 2
    products, names, amounts = [], [], []
    for _ in range(n_products):
        b, t = rng.choice(BRANDS), rng.choice(PTYPES)
        amt = rng.randrange(*PRICE_RANGE[t])
        products.append({"brand": b, "product_type": t, "amount": amt, "image_url": f"images/{b}-{t}.jpeg"})
        names.append(f"{b} {t}")
        amounts.append(amt)
    if variant == "too_old":
        purchase = f"2019-{rng.randrange(9, 11):02d}-{rng.randrange(1, 29):02d}"
    else:
        purchase = f"{rng.choice(['2019-12', '2020-01', '2020-02', '2020-03'])}-{rng.randrange(1, 29):02d}"
    return {
        "personal": {
            "customer_name": name,
            "email": f"{username}@email.com",
            "member_level": level,
            "phone": f"({rng.randrange(201, 989)}) {rng.randrange(200, 999)}-{rng.randrange(1000, 9999)}",
            "username": username,
        },
        "order": {
            "street_address": street,
            "full_address": f"{street}  {city}, {state} {zip_code}",
            "city": city,
            "num_products": str(n_products),
            "order_id": str(rng.randrange(1_000_000_000, 9_999_999_999)),
            "packaging": rng.choice(["yes", "yes", "no"]),
            "payment_method": payment,
            "products": repr(products),
            "purchase_date": purchase,
            "state": state,
            "zip_code": zip_code,
        },
        "product": {"names": names, "amounts": amounts},
        "flow": FLOW_OF[subflow],
        "subflow": subflow,
    }


def delex_pairs(c: Ctx) -> list[tuple[str, str]]:
    pairs = [
        (c.full_address, "<full_address>"), (c.email, "<email>"), (c.username, "<username>"),
        (c.order_id, "<order_id>"), (c.phone, "<phone>"), (c.street, "<street_address>"), (c.zip, "<zip_code>"),
    ]
    pairs += list(c.extra.items())
    pairs = [(v.lower(), ph) for v, ph in pairs]
    return sorted(pairs, key=lambda x: -len(x[0]))  # longest first (email before username, ...)


def build_abcd(convo_id: int, sc: dict, style: str, variant: str) -> dict:
    r = random.Random(rng.getrandbits(64))  # per-conversation stream derived from the main seed
    c = Ctx(sc, style, variant.split(":")[0] if variant.startswith("repeat") else variant, r)
    entries = BUILDERS[sc["subflow"]](c)
    pairs = delex_pairs(c)
    original, delexed = [], []
    for i, ent in enumerate(entries, start=1):
        speaker, text = ent[0], ent[1]
        original.append([speaker, text])
        low = text.lower()
        for v, ph in pairs:
            low = low.replace(v, ph)
        if speaker == "agent":
            cands = r.sample(range(40000), 10)
            targets = [sc["subflow"], "retrieve_utterance", None, [], r.randrange(10)]
        elif speaker == "customer":
            cands, targets = [], [sc["subflow"], None, None, [], -1]
        else:
            cands, targets = [], [sc["subflow"], "take_action", ent[2], list(ent[3]), -1]
        delexed.append({"speaker": speaker, "text": low, "turn_count": i, "targets": targets, "candidates": cands})
    return {"convo_id": convo_id, "scenario": sc, "original": original, "delexed": delexed}


def build_abcd_all() -> dict:
    ids = rng.sample(range(1000, 10000), len(ABCD_PLAN))
    keyed: dict[str, dict] = {}
    splits = {"train": [], "dev": [], "test": []}
    for cid, (name, subflow, style, level, payment, split, variant) in zip(ids, ABCD_PLAN):
        if variant.startswith("repeat:"):
            sc = json.loads(json.dumps(keyed[variant.split(":")[1]]))
        else:
            sc = make_scenario(name, subflow, level, payment, variant)
            if variant.startswith("key:"):
                keyed[variant.split(":")[1]] = sc
                variant = ""
        splits[split].append(build_abcd(cid, sc, style, variant))
    return splits


# ---------------------------------------------------------------------------
# ABCD guidelines (our own support manual, with checkable policy rules)
# ---------------------------------------------------------------------------

def _a(kind, button, text, *subtext):
    return {"type": kind, "button": button, "text": text, "subtext": list(subtext)}


PULL_UP = _a("interaction", "Pull up Account",
             "Start by asking for the customer's full name (first and last) and enter it with [Pull up Account]. This loads their account in the background.")
VALIDATE = _a("kb query", "Validate Purchase", "Confirm the purchase is real with [Validate Purchase]. You need all three of:",
              "Username - if the customer does not remember it, run the Recover Username subflow first",
              "Email address",
              "Order ID - a 10-digit number found in the confirmation email or on the receipt")
VERIFY = _a("kb query", "Verify Identity", "Verify the customer's identity with [Verify Identity] using their full name plus two of the following:",
            "Zip code", "Phone number on file", "Email address on file",
            "Never reveal account information before verification succeeds")
MEMBERSHIP = _a("faq/policy", "Membership Privileges", "Ask for the customer's membership level (guest, bronze, silver or gold) and record it with [Membership Privileges].",
                "Gold: unlimited returns, free shipping on every order, unexpected fees waived",
                "Silver: unexpected fees waived, returns within 90 days",
                "Bronze and guest: returns within 90 days, standard fees apply")

GUIDELINES = {
    "Account Access": {
        "description": "logging in: usernames, passwords and two-factor authentication",
        "subflows": {
            "Recover Username": {
                "actions": [
                    PULL_UP,
                    _a("kb query", "Verify Identity", "Ask for three of the four items below and press [Verify Identity]:",
                       "Full name", "Zip code", "Phone number", "Email address"),
                    _a("communication", "N/A", "Once verified, read the username back to the customer exactly as it is stored.",
                       "The account username cannot be changed. If the customer wants a different username, they must open a new account."),
                ],
                "instructions": ["Help the customer find their username.",
                                 "Policy: usernames are permanent. Do not promise a username change, not even for gold members."],
            },
            "Recover Password": {
                "actions": [
                    PULL_UP,
                    _a("interaction", "Enter Details", "Ask for the username (or the email on file) and enter it with [Enter Details].",
                       "If they do not know their username, run Recover Username first"),
                    _a("communication", "N/A", "Explain that agents cannot see or read out the customer's current password; you will generate a new temporary one instead."),
                    _a("kb query", "Make Password", "To run [Make Password] you need one of:",
                       "The PIN number on the account", "The answer to the security question"),
                ],
                "instructions": ["Generate a new temporary password and share it with the customer.",
                                 "Policy: old passwords are never disclosed, and a new password is only generated after a PIN or security answer is given."],
            },
            "Reset Two-Factor Auth": {
                "actions": [
                    PULL_UP,
                    _a("interaction", "Enter Details", "Ask for the email address on the account and enter it with [Enter Details].",
                       "If the email given does not match the one on file, do not continue; the link can only go to the email on file"),
                    _a("interaction", "Send Link", "Press [Send Link] to email the reset link together with our account security best practices.",
                       "Two-factor authentication can only be reset by sending a link to the email on file.",
                       "Never reset it over the phone, by text message, or by sending the link to a new email address."),
                ],
                "instructions": ["Tell the customer a reset link is being sent to their email, then follow the steps.",
                                 "Policy: two-factor authentication can only be reset by sending a link to the email on file."],
            },
        },
    },
    "Manage Account": {
        "description": "changing profile details and questions about account credit",
        "subflows": {
            "Manage Change Address": {
                "actions": [
                    PULL_UP,
                    VERIFY,
                    _a("interaction", "Record Reason", "Ask why the customer is changing the address and record it with [Record Reason]."),
                    _a("interaction", "Update Account", "Enter the new street address with [Update Account].",
                       "Only the address on the account is updated; orders that have already shipped keep their original address",
                       "The account username cannot be changed as part of this or any other flow"),
                ],
                "instructions": ["Update the customer's address after verifying their identity.",
                                 "Policy: the account username cannot be changed; only address, phone and payment details can be edited."],
            },
            "Manage Change Phone": {
                "actions": [
                    PULL_UP,
                    VERIFY,
                    _a("interaction", "Record Reason", "Record why the phone number is changing with [Record Reason]."),
                    _a("interaction", "Update Account", "Enter the new phone number with [Update Account]."),
                ],
                "instructions": ["Update the phone number only after identity verification succeeds.",
                                 "Policy: the old phone number is needed for verification; if the customer no longer knows it, verify with zip code and email instead."],
            },
            "Status Credit Missing": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("kb query", "Ask the Oracle", "Press [Ask the Oracle] to check whether the promised credit was applied to the account."),
                    _a("interaction", "Promo Code", "If the credit is missing, issue it as a promo code with [Promo Code] for the same amount.",
                       "Promo codes expire after 7 days; tell the customer",
                       "Credits older than 30 days that were never claimed are not reissued"),
                ],
                "instructions": ["Find out whether a promised credit was applied and fix it if not.",
                                 "Policy: missing credits are replaced with a promo code of equal value, never with cash."],
            },
        },
    },
    "Order Issue": {
        "description": "questions and changes to an order that has been placed",
        "subflows": {
            "Status Delivery Time": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("interaction", "Shipping Status", "Record the current shipping status with [Shipping Status]: order received, in transit, out for delivery or delivered."),
                    _a("kb query", "Ask the Oracle", "Use [Ask the Oracle] to check the expected delivery date."),
                    _a("interaction", "Update Order", "If the order is past the delivery window, upgrade it with [Update Order] to next day shipping at no charge.",
                       "Orders normally arrive within 7 business days after purchase",
                       "Only orders past this window are upgraded for free"),
                ],
                "instructions": ["Tell the customer when their order will arrive.",
                                 "Policy: free next-day upgrades are only given to orders that are past the 7 business day delivery window."],
            },
            "Manage Cancel": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("interaction", "Shipping Status", "Check the status with [Shipping Status].",
                       "Orders can only be cancelled while their status is 'order received'",
                       "Once an order is in transit, out for delivery or delivered it cannot be cancelled; the customer must wait for delivery and start a return",
                       "If the order has already shipped, its delivery date and address cannot be changed either"),
                    _a("interaction", "Record Reason", "Record the reason for cancelling with [Record Reason]."),
                    _a("interaction", "Update Order", "Cancel the order with [Update Order] (cancel order). The refund goes back to the original payment method."),
                ],
                "instructions": ["Cancel orders that have not shipped yet.",
                                 "Policy: orders that have already shipped cannot be cancelled."],
            },
            "Status Mystery Fee": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("kb query", "Ask the Oracle", "Use [Ask the Oracle] to find out what the unexpected fee is for, and explain it to the customer."),
                    MEMBERSHIP,
                    _a("interaction", "Update Order", "Waive the fee with [Update Order] (waive fee) only if the customer is eligible.",
                       "Unexpected fees can be waived only for gold and silver members",
                       "For bronze and guest members the fee stays: explain it, but agents cannot remove the fee"),
                ],
                "instructions": ["Explain unexpected charges on an order.",
                                 "Policy: only gold and silver members can have fees waived."],
            },
        },
    },
    "Product Defect": {
        "description": "refunds and returns of items the customer has received",
        "subflows": {
            "Initiate Refund": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("interaction", "Record Reason", "Ask why the customer wants a refund and record it with [Record Reason]."),
                    _a("interaction", "Enter Details", "Enter the account ID with [Enter Details] so the refund reaches the payment method on file."),
                    _a("interaction", "Offer Refund", "Enter the refund amount (without the dollar sign) and press [Offer Refund].",
                       "Refunds are issued only to the original payment method; paper checks and transfers to other accounts are not available",
                       "Orders paid with a gift card are refunded as account value",
                       "The refund can never exceed the price paid for the item"),
                ],
                "instructions": ["Process refunds for defective items.",
                                 "Policy: refunds are issued only to the original payment method."],
            },
            "Return Due to Size": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    MEMBERSHIP,
                    _a("communication", "N/A", "Check the return window before going further:",
                       "Only gold members have unlimited returns",
                       "Returns are only accepted within 90 days of purchase for non-gold members",
                       "If the purchase is outside the window, politely decline; if the customer insists, you may offer to notify the manager, who can review it"),
                    _a("interaction", "Enter Details", "Enter the full address where the return label should be sent with [Enter Details]."),
                    _a("interaction", "Update Order", "Record how the item comes back with [Update Order]: by mail, in store, or drop off center.",
                       "The refund is issued to the original payment method once the item is received"),
                ],
                "instructions": ["Set up a return for an item that does not fit.",
                                 "Policy: returns are only accepted within 90 days of purchase for non-gold members."],
            },
            "Return Due to Color": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    MEMBERSHIP,
                    _a("communication", "N/A", "Check the return window:",
                       "Only gold members have unlimited returns",
                       "Returns are only accepted within 90 days of purchase for non-gold members"),
                    _a("interaction", "Enter Details", "Enter the customer's full address with [Enter Details]."),
                    _a("interaction", "Update Order", "Choose the return method with [Update Order]: by mail, in store, or drop off center."),
                ],
                "instructions": ["Set up a return for an item whose color does not match the listing.",
                                 "Policy: items must be unworn with tags attached; the 90-day window applies to non-gold members."],
            },
        },
    },
    "Purchase Dispute": {
        "description": "disagreements about prices, promotions and promo codes",
        "subflows": {
            "Bad Price Competitor": {
                "actions": [
                    PULL_UP,
                    _a("interaction", "Record Reason", "Ask where the customer saw the lower price and record 'competitor' with [Record Reason]."),
                    VALIDATE,
                    _a("faq/policy", "Policy", "Check the price-match rules with [Policy]:",
                       "We price-match identical items from major retailers within 14 days of purchase",
                       "We do not price-match competitors for items on sale, clearance or flash deals; only their regular price counts",
                       "The difference is given as a promo code, never as cash"),
                    _a("interaction", "Promo Code", "If the request qualifies, issue a promo code for the difference with [Promo Code]. Promo codes expire after 7 days."),
                ],
                "instructions": ["Handle customers who found our item cheaper elsewhere.",
                                 "Policy: we do not price-match competitors for items on sale."],
            },
            "Promo Code Invalid": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("kb query", "Ask the Oracle", "Use [Ask the Oracle] to find out why the code failed.",
                       "Promo codes expire after 7 days",
                       "Promo codes cannot be applied to orders that have already shipped",
                       "Only one promo code can be used per order"),
                    _a("interaction", "Promo Code", "If a valid, unexpired code failed because of a system error, issue a replacement with [Promo Code]."),
                ],
                "instructions": ["Help customers whose promo code did not work.",
                                 "Policy: promo codes expire after 7 days and cannot be applied to orders that have already shipped.",
                                 "If the order has already shipped, the code cannot be added to it afterwards."],
            },
        },
    },
    "Shipping Issue": {
        "description": "tracking, missing items and shipping charges",
        "subflows": {
            "Shipping Status": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("interaction", "Shipping Status", "Tell the customer the status recorded with [Shipping Status]."),
                    _a("interaction", "Update Order", "If the customer needs the item sooner, upgrade the shipping with [Update Order].",
                       "Upgrades are free for gold members and for orders past the 7 business day delivery window",
                       "If an order has already shipped, the delivery address cannot be changed"),
                ],
                "instructions": ["Give customers an update on where their package is."],
            },
            "Missing Item": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    _a("interaction", "Record Reason", "Record which item is missing with [Record Reason]."),
                    _a("interaction", "Make Purchase", "Send a free replacement with [Make Purchase].",
                       "Missing items are only reshipped if the order status is delivered and the claim is made within 30 days of delivery",
                       "Each order can receive at most one free replacement"),
                ],
                "instructions": ["Replace items that did not arrive in a delivered package.",
                                 "Policy: claims later than 30 days after delivery go to the manager via [Notify Team]."],
            },
            "Shipping Cost": {
                "actions": [
                    PULL_UP,
                    VALIDATE,
                    MEMBERSHIP,
                    _a("interaction", "Shipping Status", "Check whether the order has shipped with [Shipping Status]."),
                    _a("interaction", "Offer Refund", "Refund the shipping fee with [Offer Refund] only when allowed:",
                       "Gold members always ship free, so any shipping charge on a gold order is refunded",
                       "Shipping fees are non-refundable once the order has shipped; agents cannot refund the shipping fee on a shipped order",
                       "A fee can be refunded only while the order status is order received"),
                ],
                "instructions": ["Answer questions about shipping charges.",
                                 "Policy: shipping fees are non-refundable once the order has shipped."],
            },
        },
    },
    "Storewide Query": {
        "description": "general FAQ questions about pricing, membership and store policies",
        "subflows": {
            "Pricing FAQ": {
                "actions": [
                    _a("faq/policy", "Search FAQ", "Click [Search FAQ] as soon as you recognise a general question that needs no account details."),
                    _a("faq/policy", "Pricing", "Open the pricing answers with [Pricing].",
                       "Gift wrapping costs $5 per item and is free for gold members",
                       "Overnight shipping costs $25 and is free for gold members",
                       "Prices are the same online and in stores"),
                    _a("communication", "N/A", "Explain the answer in your own words; do not paste it."),
                ],
                "instructions": ["Answer pricing questions without pulling up an account."],
            },
            "Membership FAQ": {
                "actions": [
                    _a("faq/policy", "Search FAQ", "Click [Search FAQ]."),
                    _a("faq/policy", "Membership", "Open the membership answers with [Membership].",
                       "Gold status requires $1,000 of purchases within one calendar year",
                       "Gold: free shipping, unlimited returns, unexpected fees waived",
                       "Silver: unexpected fees waived",
                       "Membership levels cannot be bought or transferred between accounts"),
                    _a("communication", "N/A", "Explain the answer in your own words."),
                ],
                "instructions": ["Explain what each membership level includes."],
            },
            "Policy FAQ": {
                "actions": [
                    _a("faq/policy", "Search FAQ", "Click [Search FAQ]."),
                    _a("faq/policy", "Policy", "Open the policy answers with [Policy].",
                       "Returns: 90 days for non-gold members, unlimited for gold; items must be unworn with tags",
                       "In-store purchases can be returned online and vice versa",
                       "Refunds are issued only to the original payment method"),
                    _a("communication", "N/A", "Explain the answer in your own words."),
                ],
                "instructions": ["Answer questions about store policies."],
            },
        },
    },
    "Subscription Inquiry": {
        "description": "billing for the premium subscription service",
        "subflows": {
            "Status Due Amount": {
                "actions": [
                    PULL_UP,
                    VERIFY,
                    _a("kb query", "Subscription Status", "Look up the balance and due date with [Subscription Status] and tell the customer.",
                       "Agents can state the amount due but cannot change it"),
                ],
                "instructions": ["Tell the customer how much they owe on their subscription."],
            },
            "Manage Pay Bill": {
                "actions": [
                    PULL_UP,
                    VERIFY,
                    _a("kb query", "Subscription Status", "Check the amount due with [Subscription Status]."),
                    _a("interaction", "Enter Details", "Enter the last four digits of the card being used with [Enter Details].",
                       "Subscription bills can be paid with a credit or debit card; gift cards cannot be used for subscription bills"),
                    _a("interaction", "Update Account", "Record the payment with [Update Account] (pay bill).",
                       "Subscription bills cannot be extended more than 30 days past the due date",
                       "A bill can be extended at most once; customers cannot get an extension beyond 30 days",
                       "Partial payments are not accepted"),
                ],
                "instructions": ["Take payment for the premium subscription.",
                                 "Policy: bills cannot be extended more than 30 days."],
            },
        },
    },
}

SUBFLOW_TITLES = {
    "recover_username": "Recover Username", "recover_password": "Recover Password", "reset_2fa": "Reset Two-Factor Auth",
    "manage_change_address": "Manage Change Address", "manage_change_phone": "Manage Change Phone",
    "status_credit_missing": "Status Credit Missing", "status_delivery_time": "Status Delivery Time",
    "manage_cancel": "Manage Cancel", "status_mystery_fee": "Status Mystery Fee", "refund_initiate": "Initiate Refund",
    "return_size": "Return Due to Size", "return_color": "Return Due to Color",
    "bad_price_competitor": "Bad Price Competitor", "promo_code_invalid": "Promo Code Invalid",
    "status": "Shipping Status", "missing": "Missing Item", "cost": "Shipping Cost",
    "pricing": "Pricing FAQ", "membership": "Membership FAQ", "policy": "Policy FAQ",
    "status_due_amount": "Status Due Amount", "manage_pay_bill": "Manage Pay Bill",
}

# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "raw")
    out = ap.parse_args().out

    chats = {
        "wildchat_general": [build_chat(c) for c in GENERAL],
        "wildchat_coding": [build_chat(c) for c in CODING],
        "tom_social": [build_chat(c) for c in TOM],
    }
    for src, rows in chats.items():
        rows.sort(key=lambda r: r["timestamp"])
        write_jsonl(out / "chats" / f"{src}.jsonl", rows)

    tt = [build_thoughttrace(s) for s in THOUGHTTRACE]
    write_jsonl(out / "thoughttrace" / "thoughttrace.jsonl", tt)

    abcd = build_abcd_all()
    write_json(out / "abcd" / "abcd_v1.1.json", abcd)
    used = sorted({c["scenario"]["subflow"] for split in abcd.values() for c in split})
    write_json(out / "abcd" / "kb.json", {s: KB[s] for s in used})
    # sanity: every used subflow has a guideline entry under its flow
    for s in used:
        flow_title = FLOW_OF[s].replace("_", " ").title()
        assert SUBFLOW_TITLES[s] in GUIDELINES[flow_title]["subflows"], s
    write_json(out / "abcd" / "guidelines.json", GUIDELINES)

    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote fixtures to {out} ({total / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
